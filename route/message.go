package route

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// MessagePrefix is the logical decoding message prefix of table-less outbox
// events (pg_logical_emit_message(true, 'outbox', content)).
const MessagePrefix = "outbox"

// RowFromMessage decodes the content of a transactional logical decoding
// message with prefix "outbox" (a table-less outbox event): a JSON object
// {"id", "aggregatetype", "aggregateid", "type", "payload", ...}. The four
// named fields must be strings (or null); payload is kept as its JSON text,
// like a jsonb column. Any other member becomes a column too, so that
// additional placements and tracing work: strings as text, numbers as
// int8 or float8, booleans as bool, objects and arrays as jsonb, null as
// SQL NULL. Columns keep the members' order.
func RowFromMessage(content []byte, src Source) (*Row, error) {
	dec := json.NewDecoder(bytes.NewReader(content))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, &Error{Class: ClassInvalidPayload, Msg: "logical message content is not a JSON object", Err: err}
	}
	row := &Row{Source: src}
	seen := map[string]int{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, &Error{Class: ClassInvalidPayload, Msg: "logical message content is not a JSON object", Err: err}
		}
		name := kt.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, &Error{Class: ClassInvalidPayload, Msg: fmt.Sprintf("logical message field %q", name), Err: err}
		}
		col := Column{Name: name}
		switch name {
		case "id", "aggregatetype", "aggregateid", "type":
			col.Type = OIDText
			if name == "id" {
				col.Type = OIDUUID
			}
			if string(raw) == "null" {
				col.Null = true
				break
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, &Error{Class: ClassInvalidPayload, Msg: fmt.Sprintf("logical message field %q is not a string", name), Err: err}
			}
			col.Value = []byte(s)
		case "payload":
			col.Type = OIDJSONB
			if string(raw) == "null" {
				col.Null = true
			} else {
				col.Value = append([]byte(nil), raw...)
			}
		default:
			col.Type, col.Value, col.Null = messageColumn(raw)
		}
		if i, dup := seen[name]; dup {
			row.Columns[i] = col // the last member wins, as in a JSON object
			continue
		}
		seen[name] = len(row.Columns)
		row.Columns = append(row.Columns, col)
	}
	if _, err := dec.Token(); err != nil {
		return nil, &Error{Class: ClassInvalidPayload, Msg: "logical message content is not a JSON object", Err: err}
	}
	if dec.More() {
		return nil, &Error{Class: ClassInvalidPayload, Msg: "logical message content has data after the JSON object"}
	}
	for _, name := range []string{"id", "aggregatetype", "aggregateid", "type", "payload"} {
		if _, ok := seen[name]; !ok {
			typ := OIDText
			switch name {
			case "id":
				typ = OIDUUID
			case "payload":
				typ = OIDJSONB
			}
			row.Columns = append(row.Columns, Column{Name: name, Type: typ, Null: true})
		}
	}
	return row, nil
}

func messageColumn(raw json.RawMessage) (uint32, []byte, bool) {
	switch {
	case string(raw) == "null":
		return OIDText, nil, true
	case string(raw) == "true":
		return OIDBool, []byte("t"), false
	case string(raw) == "false":
		return OIDBool, []byte("f"), false
	case raw[0] == '"':
		var s string
		_ = json.Unmarshal(raw, &s)
		return OIDText, []byte(s), false
	case raw[0] == '{' || raw[0] == '[':
		return OIDJSONB, append([]byte(nil), raw...), false
	}
	if bytes.ContainsAny(raw, ".eE") {
		return OIDFloat8, append([]byte(nil), raw...), false
	}
	return OIDInt8, append([]byte(nil), raw...), false
}
