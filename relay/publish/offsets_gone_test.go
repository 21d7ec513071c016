package publish

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/offsets"
)

// TestOffsetsTopicDeletedEndsSession: the exactly-once offsets topic
// deleted under a running transactional producer. The next commit's
// position record waits for the unknown topic (franz-go retries it
// without end), so the commit's flush would never return. The topic
// watcher names it within two of its looks (here 200 ms apart): an error
// log line, outbox_connector_topic_missing{topic} at 1, the Blocked hook;
// and the session ends with an error that is not fatal (the next start
// applies the rule for a lost offsets topic) and names the topic and
// OUTBOX_ON_OFFSETS_LOSS. The event of the aborted transaction is not
// acked.
func TestOffsetsTopicDeletedEndsSession(t *testing.T) {
	s := uniqueSuffix()
	aggType, dlq, offs := "eogone"+s, "dlq"+s, "offsets"+s
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, "outbox.event."+aggType, offs))
	cfg := Config{DLQTopic: dlq, Transactional: true, Offsets: &Offsets{
		Topic: offs, Key: offsets.Key{SystemID: "1", Database: "outbox", Slot: "outbox_slot"},
		Base: offsets.Position{Epoch: 1, Timeline: 1},
	}}
	r := startTopicRunPublished(t, brokers, cfg, 100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
	resp, err := r.adm.DeleteTopic(context.Background(), offs)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	r.send(200, eventRow("id", "e2", aggType, "a", `{}`, 190, 200))
	const bound = 5 * time.Second
	select {
	case err = <-r.done:
	case <-time.After(bound):
		t.Fatalf("the session neither ended nor named the deleted offsets topic within %v (Blocked %q, topic_missing %v); log:\n%s", bound, r.reason(), r.missing(offs), r.lb.String())
	}
	t.Logf("the session ended %v after the offsets topic was deleted: %v", time.Since(deleted).Round(time.Millisecond), err)
	if err == nil || fatal.Is(err) || !strings.Contains(err.Error(), offs) || !strings.Contains(err.Error(), "OUTBOX_ON_OFFSETS_LOSS") {
		t.Errorf("the session ended with %v; want an error that is not fatal, naming %s and OUTBOX_ON_OFFSETS_LOSS", err, offs)
	}
	if log := r.lb.String(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, offs) {
		t.Errorf("no error log line names the offsets topic; log:\n%s", log)
	}
	if got := r.missing(offs); got != 1 {
		t.Errorf("outbox_connector_topic_missing{topic=%q} = %v once the session ended; want 1 (the next start clears it)", offs, got)
	}
	if !strings.Contains(r.reason(), offs) {
		t.Errorf("Blocked %q; want it to name %s", r.reason(), offs)
	}
	if got := r.tr.Acked(); got != 100 {
		t.Errorf("acked %d; want 100: the transaction whose position could not be written is not confirmed", got)
	}
}
