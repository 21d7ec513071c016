package route

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// maxTopicLen is Kafka's limit (org.apache.kafka.common.internals.Topic).
const maxTopicLen = 249

// ValidTopic reports whether Kafka would accept name as a topic name (the
// rules of org.apache.kafka.common.internals.Topic.validate); the error is an
// *Error of class ClassInvalidTopic.
func ValidTopic(name string) error {
	if name == "" || name == "." || name == ".." {
		return &Error{Class: ClassInvalidTopic, Msg: fmt.Sprintf("topic name %q is not allowed", name)}
	}
	if len(name) > maxTopicLen {
		return &Error{Class: ClassInvalidTopic, Msg: fmt.Sprintf("topic name of %d characters is longer than Kafka's %d", len(name), maxTopicLen)}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return &Error{Class: ClassInvalidTopic, Msg: fmt.Sprintf("topic name %q has a character Kafka rejects (%q); only [a-zA-Z0-9._-] are legal", name, c)}
		}
	}
	return nil
}

// topicRule is Kafka Connect's RegexRouter as the EventRouter configures it:
// when the whole routed value matches route.topic.regex, the topic is
// Matcher.replaceFirst(route.topic.replacement); otherwise the topic is the
// routed value itself.
type topicRule struct {
	full *regexp.Regexp // anchored: Matcher.matches()
	find *regexp.Regexp // unanchored: Matcher.find(), which replaceFirst uses
	tmpl []replPiece
}

// replPiece is a literal (group < 0) or a group reference of a replacement.
type replPiece struct {
	lit   string
	group int
}

// javaDot is what "." matches in a java.util.regex.Pattern without DOTALL:
// anything but a line terminator.
const javaDot = `[^\n\r\x{85}\x{2028}\x{2029}]`

// dotallFlag finds an inline (?s) flag group.
var dotallFlag = regexp.MustCompile(`\(\?[a-zA-Z]*s[a-zA-Z-]*[:)]`)

// translateJavaRegex rewrites the parts of a Java pattern whose meaning
// differs in RE2 and rejects Java names RE2 would accept.
func translateJavaRegex(p string) (string, error) {
	if dotallFlag.MatchString(p) {
		// Flags are rare in topic regexes; with DOTALL in play leave "." to RE2.
		return p, nil
	}
	var b strings.Builder
	inClass := 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			if p[i+1] == 'Q' { // \Q...\E is literal text in both dialects
				end := strings.Index(p[i+2:], `\E`)
				if end < 0 {
					b.WriteString(p[i:])
					return b.String(), nil
				}
				b.WriteString(p[i : i+2+end+2])
				i += 2 + end + 1
				continue
			}
			b.WriteByte(c)
			b.WriteByte(p[i+1])
			i++
		case c == '[':
			if inClass > 0 {
				return "", fmt.Errorf("nested character classes ([a[b]], [a&&[b]]) are Java-only")
			}
			inClass++
			b.WriteByte(c)
			// A ']' right after '[' or '[^' is a literal in both dialects.
			if i+1 < len(p) && p[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
			if i+1 < len(p) && p[i+1] == ']' {
				b.WriteByte(']')
				i++
			}
		case c == ']' && inClass > 0:
			inClass--
			b.WriteByte(c)
		case c == '.' && inClass == 0:
			b.WriteString(javaDot)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func isASCIIAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// compileTopicRule compiles route.topic.regex and route.topic.replacement,
// failing at configuration time where Java would fail on every record.
func compileTopicRule(pattern, replacement string) (*topicRule, error) {
	tp, err := translateJavaRegex(pattern)
	if err != nil {
		return nil, fmt.Errorf("route.topic.regex %q: %v", pattern, err)
	}
	find, err := regexp.Compile(tp)
	if err != nil {
		return nil, fmt.Errorf("route.topic.regex %q: %v", pattern, err)
	}
	full := regexp.MustCompile(`\A(?:` + tp + `)\z`)
	names := map[string]int{}
	for i, n := range find.SubexpNames() {
		if n == "" {
			continue
		}
		// Java group names are [a-zA-Z][a-zA-Z0-9]*.
		ok := n[0] >= 'a' && n[0] <= 'z' || n[0] >= 'A' && n[0] <= 'Z'
		for j := 0; j < len(n); j++ {
			ok = ok && isASCIIAlnum(n[j])
		}
		if !ok {
			return nil, fmt.Errorf("route.topic.regex %q: group name %q is not valid in Java", pattern, n)
		}
		names[n] = i
	}
	groups := find.NumSubexp()
	r := &topicRule{full: full, find: find}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			r.tmpl = append(r.tmpl, replPiece{lit: lit.String(), group: -1})
			lit.Reset()
		}
	}
	// The syntax of Matcher.appendReplacement.
	for i := 0; i < len(replacement); i++ {
		c := replacement[i]
		switch c {
		case '\\':
			i++
			if i == len(replacement) {
				return nil, fmt.Errorf("route.topic.replacement %q: character to be escaped is missing", replacement)
			}
			lit.WriteByte(replacement[i])
		case '$':
			i++
			if i == len(replacement) {
				return nil, fmt.Errorf("route.topic.replacement %q: illegal group reference: group index is missing", replacement)
			}
			ref := -1
			if replacement[i] == '{' {
				j := i + 1
				for j < len(replacement) && isASCIIAlnum(replacement[j]) {
					j++
				}
				name := replacement[i+1 : j]
				switch {
				case name == "":
					return nil, fmt.Errorf("route.topic.replacement %q: named capturing group has 0 length name", replacement)
				case j == len(replacement) || replacement[j] != '}':
					return nil, fmt.Errorf("route.topic.replacement %q: named capturing group is missing trailing '}'", replacement)
				case name[0] >= '0' && name[0] <= '9':
					return nil, fmt.Errorf("route.topic.replacement %q: capturing group name {%s} starts with digit character", replacement, name)
				}
				g, ok := names[name]
				if !ok {
					return nil, fmt.Errorf("route.topic.replacement %q: no group with name {%s} in route.topic.regex %q", replacement, name, pattern)
				}
				ref = g
				i = j
			} else {
				d := replacement[i]
				if d < '0' || d > '9' {
					return nil, fmt.Errorf("route.topic.replacement %q: illegal group reference", replacement)
				}
				ref = int(d - '0')
				// Take the longest group number that exists, as Java does.
				for i+1 < len(replacement) && replacement[i+1] >= '0' && replacement[i+1] <= '9' {
					n := ref*10 + int(replacement[i+1]-'0')
					if n > groups {
						break
					}
					ref = n
					i++
				}
				if ref > groups {
					return nil, fmt.Errorf("route.topic.replacement %q: no group %d in route.topic.regex %q", replacement, ref, pattern)
				}
			}
			flush()
			r.tmpl = append(r.tmpl, replPiece{group: ref})
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return r, nil
}

// apply returns the topic for a routed value.
func (r *topicRule) apply(v string) string {
	if !r.full.MatchString(v) {
		return v // RegexRouter leaves the topic alone
	}
	m := r.find.FindStringSubmatchIndex(v)
	if m == nil { // cannot happen: a full match is a match
		return v
	}
	var b strings.Builder
	b.WriteString(v[:m[0]])
	for _, p := range r.tmpl {
		if p.group < 0 {
			b.WriteString(p.lit)
			continue
		}
		if s, e := m[2*p.group], m[2*p.group+1]; s >= 0 && e >= 0 {
			b.WriteString(v[s:e])
		}
	}
	b.WriteString(v[m[1]:])
	return b.String()
}

// topicCache remembers the topic (or the topic error) of recent routed
// values: aggregate types are few, and this keeps the regex and the topic
// string off the per-event path.
type topicCache struct {
	mu sync.RWMutex
	m  map[string]topicEntry
}

type topicEntry struct {
	topic string
	err   error
}

// maxCachedTopics bounds the cache; past it topics are computed per event.
const maxCachedTopics = 4096

func (c *topicCache) get(v []byte) (topicEntry, bool) {
	c.mu.RLock()
	e, ok := c.m[string(v)]
	c.mu.RUnlock()
	return e, ok
}

func (c *topicCache) put(v string, e topicEntry) {
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string]topicEntry)
	}
	if len(c.m) < maxCachedTopics {
		c.m[v] = e
	}
	c.mu.Unlock()
}

// TopicOf returns the function that maps a route.by.field value to its
// topic under cfg's route.topic.regex and route.topic.replacement, as Route
// does, without the rest of a router (no schema registry): for the tools
// that only need to know where an event should be, such as slotwatch's
// canary and audit.
func TopicOf(cfg Config) (func(value string) (string, error), error) {
	rule, err := compileTopicRule(cfg.TopicRegex, cfg.TopicReplacement)
	if err != nil {
		return nil, err
	}
	return func(v string) (string, error) {
		t := rule.apply(v)
		if err := ValidTopic(t); err != nil {
			return t, err
		}
		return t, nil
	}, nil
}
