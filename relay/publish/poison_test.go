package publish

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/route"
)

// TestClassify: what each produce error means for the line.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want fault
	}{
		{nil, faultNone},
		{context.Canceled, faultStop},
		{fmt.Errorf("produce: %w", context.DeadlineExceeded), faultStop},
		{kgo.ErrClientClosed, faultStop},
		{kgo.ErrAborting, faultStop},
		{kerr.ProducerFenced, faultFenced},
		{kerr.InvalidProducerEpoch, faultFenced},
		{kerr.TopicAuthorizationFailed, faultFatal},
		{kerr.ClusterAuthorizationFailed, faultFatal},
		{kerr.TransactionalIDAuthorizationFailed, faultFatal},
		{kerr.SaslAuthenticationFailed, faultFatal},
		{kgo.ErrRecordRetries, faultTransient},
		{kgo.ErrRecordTimeout, faultTransient},
		{kgo.ErrMaxBuffered, faultTransient},
		{kerr.NotLeaderForPartition, faultTransient},
		{kerr.RequestTimedOut, faultTransient},
		{kerr.UnknownTopicOrPartition, faultTransient},
		{kerr.NotEnoughReplicas, faultTransient},
		{kerr.ConcurrentTransactions, faultTransient},
		{kerr.OutOfOrderSequenceNumber, faultTransient},
		{kerr.InvalidTxnState, faultTransient},
		{kerr.TransactionAbortable, faultTransient},
		{kerr.UnsupportedVersion, faultTransient},
		{errors.New("unable to partition record due to no usable partitions"), faultTransient},
		{kerr.InvalidTimestamp, faultRecord},
		{kerr.InvalidRecord, faultRecord},
		{kerr.PolicyViolation, faultRecord},
		{fmt.Errorf("%w (uncompressed_bytes=2000000)", kerr.MessageTooLarge), faultRecord},
		{kerr.RecordListTooLarge, faultRecord},
		{kerr.InvalidTopicException, faultRecord},
		{kerr.CorruptMessage, faultRecord},
		{kerr.UnknownServerError, faultRecord},
		{errors.New("invalid record partitioning choice of 5 from 3 available"), faultRecord},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %d; want %d", tc.err, got, tc.want)
		}
	}
}

// TestRefusedCause: a record Kafka refused alone goes where its error says.
func TestRefusedCause(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want route.ErrorClass
	}{
		{fmt.Errorf("%w (uncompressed_bytes=2000000)", kerr.MessageTooLarge), route.ClassTooLarge},
		{kerr.RecordListTooLarge, route.ClassTooLarge},
		{kerr.InvalidTopicException, route.ClassInvalidTopic},
		{kerr.InvalidTimestamp, ClassRefused},
		{kerr.PolicyViolation, ClassRefused},
	} {
		c := refusedCause(tc.err)
		if c.Class != tc.want || !errors.Is(c, tc.err) {
			t.Errorf("refusedCause(%v) = %v; want class %s, wrapping the error", tc.err, c, tc.want)
		}
	}
}

// TestPoisonVerdicts: a suspect stays one until judged; a guilty record
// stays guilty when its batch fails again; an acquitted one is forgotten;
// a nil Poison knows nothing; the memory is bounded.
func TestPoisonVerdicts(t *testing.T) {
	id := rowID{commit: 10, lsn: 5, ord: 1, id: 42}
	key := poisonKey("t", id)
	var ps Poison
	if _, ok := ps.lookup("t", id); ok {
		t.Fatal("an empty Poison knows a record")
	}
	if !ps.suspect(key, kerr.InvalidRecord) {
		t.Error("suspect: a new record reported as known")
	}
	if ps.suspect(key, kerr.InvalidRecord) {
		t.Error("suspect: a suspect reported as new")
	}
	if v, ok := ps.lookup("t", id); !ok || v.guilty || !errors.Is(v.err, kerr.InvalidRecord) {
		t.Errorf("lookup after suspect = %+v, %v", v, ok)
	}
	if _, ok := ps.lookup("u", id); ok {
		t.Error("the same row for another topic is known")
	}
	ps.convict(key, kerr.InvalidTimestamp)
	if ps.suspect(key, kerr.InvalidRecord) {
		t.Error("suspect: a guilty record reported as new")
	}
	if v, ok := ps.lookup("t", id); !ok || !v.guilty || !errors.Is(v.err, kerr.InvalidTimestamp) {
		t.Errorf("lookup after convict and a new failure = %+v, %v; want guilty of INVALID_TIMESTAMP", v, ok)
	}
	ps.acquit(key)
	if _, ok := ps.lookup("t", id); ok || ps.n.Load() != 0 {
		t.Errorf("acquitted record still known (%d entries)", ps.n.Load())
	}
	var none *Poison
	none.suspect(key, kerr.InvalidRecord)
	none.convict(key, kerr.InvalidRecord)
	none.acquit(key)
	if _, ok := none.lookup("t", id); ok {
		t.Error("a nil Poison knows a record")
	}
	// The bound forgets the guilty, never a suspect (TestPoisonKeepsSuspects).
	for i := range maxPoison + 1 {
		ps.convict(poisonKey("t", rowID{lsn: uint64(i)}), kerr.InvalidRecord)
	}
	if n := ps.n.Load(); n < 1 || n > maxPoison {
		t.Errorf("%d entries after %d convictions; want at most %d", n, maxPoison+1, maxPoison)
	}
}

// TestRowIDs: identify tells apart every row, by the configured event id and
// its place in the WAL (rows without an event id by their ordinal there),
// and gives the same rows the same keys when read again, also from a
// snapshot of a table that lost a row since.
func TestRowIDs(t *testing.T) {
	rcfg := route.DefaultConfig()
	rcfg.FieldEventID = "event_id"
	router, err := route.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	rows := []*route.Row{
		eventRow("event_id", "a", "t", "k", `{}`, 0, 100), // a snapshot: LSN 0
		eventRow("event_id", "b", "t", "k", `{}`, 0, 100),
		eventRow("event_id", "", "t", "k", `{}`, 0, 100), // no event id
		eventRow("event_id", "", "t", "k", `{}`, 0, 100),
		eventRow("event_id", "c", "t", "k", `{}`, 50, 200), // one COPY: one LSN
		eventRow("event_id", "c", "t", "k", `{}`, 50, 200),
		eventRow("event_id", "c", "t", "k", `{}`, 60, 200),
		eventRow("event_id", "c", "t", "k", `{}`, 50, 300),
	}
	ids := func(rows []*route.Row) []rowID {
		p := New(Config{}, nil, router, nil, nil, nil)
		var out []rowID
		for _, r := range rows {
			out = append(out, p.identify(r))
		}
		return out
	}
	first, again := ids(rows), ids(rows)
	keys := map[string]int{}
	for i, id := range first {
		if id != again[i] {
			t.Errorf("row %d: %+v, then %+v when read again", i, id, again[i])
		}
		k := poisonKey("t", id)
		// Rows 4 and 5 have one event id at one place: one event.
		if j, ok := keys[k]; ok && !(j == 4 && i == 5) {
			t.Errorf("rows %d and %d share the key %q", j, i, k)
		}
		keys[k] = i
	}
	if k4, k5 := poisonKey("t", first[4]), poisonKey("t", first[5]); k4 != k5 {
		t.Errorf("one event id at one place, two keys: %q, %q", k4, k5)
	}
	if later := ids(rows[1:]); poisonKey("t", later[0]) != poisonKey("t", first[1]) {
		t.Error("a snapshot row's key changed when the row before it was gone")
	}
	if first[0].id == first[1].id {
		t.Error("event ids a and b hash alike: the configured column is not the one read")
	}
	if got := []uint32{first[0].ord, first[1].ord, first[2].ord, first[4].ord, first[5].ord, first[6].ord}; fmt.Sprint(got) != "[0 1 2 0 1 0]" {
		t.Errorf("ordinals %v; want [0 1 2 0 1 0]", got)
	}
	if poisonKey("t", first[0]) == poisonKey("u", first[0]) {
		t.Error("the topic is not part of the key")
	}
	if (New(Config{}, nil, nil, nil, nil, nil)).identify(nil) != (rowID{}) {
		t.Error("identify(nil) is not the zero rowID")
	}
}
