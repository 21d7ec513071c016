package route

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// javaProps is a parsed java.util.Properties text, in file order.
type javaProps struct {
	keys, vals []string
}

func (p *javaProps) get(k string) (string, bool) {
	for i := len(p.keys) - 1; i >= 0; i-- { // the last one wins, as in Properties.load
		if p.keys[i] == k {
			return p.vals[i], true
		}
	}
	return "", false
}

// parseJavaProperties reads text with the rules of Properties.load(Reader):
// "#" and "!" comments, key and value split at the first unescaped '=', ':'
// or white space, a trailing backslash continuing the line, and the
// escapes \t \n \r \f \uXXXX.
func parseJavaProperties(text []byte) *javaProps {
	p := &javaProps{}
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
		p.keys = append(p.keys, unescapeProp(line[:keyLen]))
		p.vals = append(p.vals, unescapeProp(line[valueStart:]))
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
