package audit

import (
	"encoding/json"
	"fmt"

	"github.com/pgoutbox/pgoutbox/route"
)

// DecodeID reads the text an id header or a key holds under the router's
// converter f: the string converter writes it as is, JsonConverter as a
// JSON string, and with schemas enabled inside {"schema":…,"payload":…}.
// The audit and the canary compare ids as text, so a record written with a
// JSON converter must be unwrapped first, or every event would look
// missing. ok is false when v is not what f writes (a null, or another
// converter's output).
func DecodeID(v []byte, f route.Format) (id string, ok bool) {
	if v == nil {
		return "", false
	}
	switch f {
	case route.FormatJSON:
		if err := json.Unmarshal(v, &id); err != nil {
			return "", false
		}
		return id, true
	case route.FormatJSONSchema:
		var env struct {
			Payload *string `json:"payload"`
		}
		if err := json.Unmarshal(v, &env); err != nil || env.Payload == nil {
			return "", false
		}
		return *env.Payload, true
	default:
		return string(v), true
	}
}

// CheckFormat refuses a converter whose ids the audit cannot read.
func CheckFormat(what string, f route.Format) error {
	switch f {
	case "", route.FormatString, route.FormatJSON, route.FormatJSONSchema:
		return nil
	}
	return fmt.Errorf("%s format %q: the audit reads ids written by the string, json or json-schema converters only", what, f)
}
