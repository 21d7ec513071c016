package publish

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/pgoutbox/pgoutbox/route"
)

// TestPoisonKeepsGuiltyBelowBound: below maxPoison no verdict is
// forgotten: convicting one record keeps every other guilty one (a
// forgotten one costs a failed session: it is produced in a batch again,
// refused again, suspected and tried alone again) and every suspect.
func TestPoisonKeepsGuiltyBelowBound(t *testing.T) {
	var ps Poison
	ps.suspect("s", kerr.InvalidRecord)
	for i := range 5 {
		ps.convict(fmt.Sprint("g", i), kerr.InvalidTimestamp)
	}
	for i := range 5 {
		if v, ok := ps.m[fmt.Sprint("g", i)]; !ok || !v.guilty {
			t.Errorf("guilty g%d: %+v, %v after 5 convictions; want still guilty", i, v, ok)
		}
	}
	if v, ok := ps.m["s"]; !ok || v.guilty {
		t.Errorf("suspect: %+v, %v", v, ok)
	}
	if n := ps.n.Load(); n != 6 {
		t.Errorf("n = %d; want 6", n)
	}
}

// TestRefusedAloneCountsOne: counting a suspect's refusal alone changes
// that suspect only; every other verdict stays; a Poison that knows
// nothing yet counts it too.
func TestRefusedAloneCountsOne(t *testing.T) {
	var ps Poison
	ps.suspect("a", kerr.UnknownServerError)
	ps.suspect("b", kerr.CorruptMessage)
	ps.convict("g", kerr.InvalidRecord)
	if ps.refusedAlone("a", kerr.UnknownServerError) {
		t.Fatal("convicted at the first refusal alone with UNKNOWN_SERVER_ERROR")
	}
	if v := ps.m["a"]; v.alone != 1 || v.guilty {
		t.Errorf("a: %+v; want one refusal alone, not guilty", v)
	}
	if v, ok := ps.m["b"]; !ok || v.alone != 0 || v.guilty || !errors.Is(v.err, kerr.CorruptMessage) {
		t.Errorf("b: %+v, %v; want the untouched suspect", v, ok)
	}
	if v, ok := ps.m["g"]; !ok || !v.guilty {
		t.Errorf("g: %+v, %v; want still guilty", v, ok)
	}
	if n := ps.n.Load(); n != 3 {
		t.Errorf("n = %d; want 3", n)
	}

	var fresh Poison
	if fresh.refusedAlone("x", kerr.UnknownServerError) {
		t.Fatal("a fresh Poison convicted at the first refusal alone")
	}
	if v := fresh.m["x"]; v.alone != 1 || fresh.n.Load() != 1 {
		t.Errorf("fresh: %+v (n %d); want one refusal alone counted", v, fresh.n.Load())
	}
	var none *Poison
	if !none.refusedAlone("x", kerr.UnknownServerError) {
		t.Error("a nil Poison (nothing remembered) did not convict: the line would wedge")
	}
}

// TestDLQRefusedError: the dead-letter row of an event whose DLQ record
// Kafka refused says both why the event is poison and why the DLQ topic did
// not take it, with the DLQ topic's name; its class is the cause's.
func TestDLQRefusedError(t *testing.T) {
	cause := &route.Error{Class: route.ClassMissingField, Msg: "no aggregatetype"}
	e := &dlqRefusedError{cause: cause, topic: "outbox.dlq", err: kerr.PolicyViolation}
	msg := e.Error()
	for _, want := range []string{cause.Error(), `"outbox.dlq"`, kerr.PolicyViolation.Error()} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not name %q", msg, want)
		}
	}
	if !strings.HasPrefix(msg, cause.Error()) {
		t.Errorf("%q does not start with the cause", msg)
	}
	if classOf(e) != string(route.ClassMissingField) || !errors.Is(e, kerr.PolicyViolation) {
		t.Errorf("class %q, refusal found %v; want %q, true", classOf(e), errors.Is(e, kerr.PolicyViolation), route.ClassMissingField)
	}
	re := &refusedError{err: kerr.InvalidTimestamp, n: 3}
	if !strings.Contains(re.Error(), "refused 3 record(s)") || !errors.Is(re, kerr.InvalidTimestamp) {
		t.Errorf("refusedError: %q", re.Error())
	}
}
