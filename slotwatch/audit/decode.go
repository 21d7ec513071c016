package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/route"
)

// DecodeID reads the text an id header or a key holds, whichever of the
// router's converters wrote it: the string converter writes it as is,
// JsonConverter as a JSON string (or a JSON number for a numeric id), and
// with schemas enabled inside {"schema":…,"payload":…}. The audit and the
// canary compare ids as text, so a record written with a JSON converter
// must be unwrapped first, or every event would look missing.
//
// The value is decoded by its shape, not by the converter configured now:
// during a rolling change of OUTBOX_ROUTE_HEADER_FORMAT the topics hold
// records of both converters, and an audit reading them with one of the two
// would call every event of the other missing. A value that is neither a
// JSON string nor an envelope is the string converter's (a JSON number's
// text is the id's text too). ok is false for a null, and for a value no
// converter the audit knows writes: one in the schema registry's framing
// (Avro, Protobuf; a leading zero byte, which no text id has) or that is
// not UTF-8. Taken as text, such a value would be an id no row has, and
// every event of its topic would look missing instead of unread.
func DecodeID(v []byte) (id string, ok bool) {
	if v == nil || len(v) > 0 && v[0] == 0 || !utf8.Valid(v) {
		return "", false
	}
	switch {
	case len(v) > 1 && v[0] == '"':
		if err := json.Unmarshal(v, &id); err == nil {
			return id, true
		}
	case len(v) > 1 && v[0] == '{':
		var env struct {
			Payload json.RawMessage `json:"payload"`
		}
		d := json.NewDecoder(bytes.NewReader(v))
		if err := d.Decode(&env); err == nil && env.Payload != nil {
			p := bytes.TrimSpace(env.Payload)
			switch {
			case bytes.Equal(p, []byte("null")):
				return "", false
			case len(p) > 0 && p[0] == '"':
				if err := json.Unmarshal(p, &id); err == nil {
					return id, true
				}
			case len(p) > 0 && (p[0] == '-' || p[0] >= '0' && p[0] <= '9'):
				return string(p), true
			}
		}
	}
	return string(v), true
}

// CheckFormat refuses a converter whose ids the audit cannot read.
func CheckFormat(what string, f route.Format) error {
	switch f {
	case "", route.FormatString, route.FormatJSON, route.FormatJSONSchema:
		return nil
	}
	return fmt.Errorf("%s format %q: the audit reads ids written by the string, json or json-schema converters only", what, f)
}
