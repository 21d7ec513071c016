// Package properties reads java.util.Properties text as Properties.load
// does: Debezium's and Kafka Connect's configuration files, and the span
// context column Debezium's outbox extensions write with Properties.store.
// Keys keep their file order (a duplicate's last value wins in Get), so
// that a setting a file gives twice is read as Java reads it.
package properties

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Props is a parsed java.util.Properties text: Keys[i] has Values[i], in
// file order.
type Props struct {
	Keys, Values []string
}

// Get is the value of k: the last one the text gives, as Properties.load
// keeps it.
func (p *Props) Get(k string) (string, bool) {
	for i := len(p.Keys) - 1; i >= 0; i-- { // the last one wins, as in Properties.load
		if p.Keys[i] == k {
			return p.Values[i], true
		}
	}
	return "", false
}

// Parse reads text with the rules of Properties.load(Reader):
// "#" and "!" comments, key and value split at the first unescaped '=', ':'
// or white space, a trailing backslash continuing the line, and the
// escapes \t \n \r \f \uXXXX.
func Parse(text []byte) *Props {
	p := &Props{}
	s := string(text)
	for len(s) > 0 {
		var line string
		line, s = nextLine(s)
		line = strings.TrimLeft(line, " \t\f")
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		// Continuation lines: an odd number of trailing backslashes.
		for endsInEscape(line) {
			line = line[:len(line)-1]
			if s == "" {
				break
			}
			var next string
			next, s = nextLine(s)
			line += strings.TrimLeft(next, " \t\f")
		}
		// Split key and value as Properties.load0 does.
		keyLen, valueStart, hasSep, escaped := 0, len(line), false, false
		for keyLen < len(line) {
			c := line[keyLen]
			if (c == '=' || c == ':') && !escaped {
				valueStart, hasSep = keyLen+1, true
				break
			}
			if (c == ' ' || c == '\t' || c == '\f') && !escaped {
				valueStart = keyLen + 1
				break
			}
			escaped = c == '\\' && !escaped
			keyLen++
		}
		for valueStart < len(line) {
			c := line[valueStart]
			if c != ' ' && c != '\t' && c != '\f' {
				if !hasSep && (c == '=' || c == ':') {
					hasSep = true
				} else {
					break
				}
			}
			valueStart++
		}
		p.Keys = append(p.Keys, unescapeProp(line[:keyLen]))
		p.Values = append(p.Values, unescapeProp(line[valueStart:]))
	}
	return p
}

// nextLine splits off one line ended by \n, \r or \r\n.
func nextLine(s string) (line, rest string) {
	i := strings.IndexAny(s, "\r\n")
	if i < 0 {
		return s, ""
	}
	line = s[:i]
	if s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n' {
		i++
	}
	return line, s[i+1:]
}

func endsInEscape(line string) bool {
	n := 0
	for i := len(line) - 1; i >= 0 && line[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

func unescapeProp(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+5 <= len(s) {
				if v, err := strconv.ParseUint(s[i+1:i+5], 16, 32); err == nil {
					b.WriteString(string(utf8.AppendRune(nil, rune(v))))
					i += 4
					continue
				}
			}
			b.WriteByte('u')
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
