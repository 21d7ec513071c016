package inbox_test

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// oldDeadLetter is a dead letter as the inbox wrote it before RedriveHeader
// existed: the id, the source, the reason, no redrive header.
func oldDeadLetter(id string) *kgo.Record {
	return &kgo.Record{Topic: "billing.dlq", Key: []byte("order-1"), Value: []byte(`{"amount":"12"}`),
		Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}, {Key: "eventType", Value: []byte("OrderPlaced")},
			{Key: "inbox.error", Value: []byte("amount must be a number")}, {Key: "inbox.attempts", Value: []byte("5")},
			{Key: "inbox.consumer", Value: []byte("billing")}, {Key: "inbox.source.topic", Value: []byte("outbox.event.Order")}}}
}

// TestRedriveID (review finding 9): a dead letter written before the
// redrive header existed is refused by Redrive with a message naming
// RedriveID, and RedriveID builds its redrive when the operator names its
// id: for the source topic, with the original headers, the redrive header
// and the group that dead-lettered it; a wrong or unstorable id is refused.
func TestRedriveID(t *testing.T) {
	dl := oldDeadLetter("ev-2")
	if _, err := inbox.Redrive(dl); err == nil || !strings.Contains(err.Error(), "RedriveID") {
		t.Errorf("Redrive of a dead letter without the redrive header: %v; want a refusal naming RedriveID", err)
	}
	r, err := inbox.RedriveID(dl, "ev-2")
	if err != nil {
		t.Fatal(err)
	}
	if r.Topic != "outbox.event.Order" || string(r.Key) != "order-1" || string(r.Value) != `{"amount":"12"}` {
		t.Errorf("RedriveID: topic %q key %q value %q; want the source topic and the record as it was", r.Topic, r.Key, r.Value)
	}
	for k, want := range map[string]string{"id": "ev-2", "eventType": "OrderPlaced", inbox.RedriveHeader: "ev-2", "inbox.consumer": "billing", "inbox.error": ""} {
		if got := inbox.Header(r, k); got != want {
			t.Errorf("RedriveID: header %s = %q, want %q", k, got, want)
		}
	}
	if _, err := inbox.RedriveID(dl, "ev-3"); err == nil {
		t.Error("RedriveID accepted an id that is not the dead letter's")
	}
	if _, err := inbox.RedriveID(oldDeadLetter("ev\x00"), "ev\x00"); err == nil {
		t.Error("RedriveID accepted an id the inbox cannot store")
	}
	current := oldDeadLetter("ev-2")
	current.Headers = append(current.Headers, kgo.RecordHeader{Key: inbox.RedriveHeader, Value: []byte("ev-2")})
	built, err := inbox.Redrive(current)
	if err != nil {
		t.Fatal(err)
	}
	if g := inbox.Header(built, inbox.ConsumerHeader); g != "billing" {
		t.Errorf("Redrive: group header %q, want the dead letter's group kept (billing): a redrive applies in its group only", g)
	}
}
