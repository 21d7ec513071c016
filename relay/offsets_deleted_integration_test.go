package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// offsetsNamedWithin bounds how long after the offsets topic is deleted
// under load the connector names it: the producer's topic watcher sees the
// line stopped at its second look (5 s apart) and the topic gone.
const offsetsNamedWithin = 15 * time.Second

// TestOffsetsTopicDeletedWhileStreaming: the exactly-once offsets topic
// deleted (kadm DeleteTopics) while the connector streams under load. The
// next commit's position record waits for the unknown topic; before, the
// commit's flush never returned and nothing said why (the stall alarm a
// minute later named no topic). Now, within offsetsNamedWithin, the topic
// is named: in the last error (the stall reason's source), in
// outbox_connector_topic_missing{topic} and in the log; the session ends,
// its open Kafka transaction aborted, and the next start does what the
// README's rule for a lost offsets topic says: with OUTBOX_ON_OFFSETS_LOSS=
// fail it stops with a fatal error naming the loss and the choice; with
// at-least-once it continues from the slot's position. Either way no event
// is lost: every event the load committed reaches Kafka (after the fail
// case's stop, from a start with at-least-once), which also shows nothing
// was confirmed to PostgreSQL without being in Kafka (the slot would not
// give it again); duplicates are allowed (at-least-once after the loss).
func TestOffsetsTopicDeletedWhileStreaming(t *testing.T) {
	for _, onLoss := range []string{"fail", "at-least-once"} {
		t.Run(onLoss, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("eodel")
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			cfg.OffsetsTopic = "offsets." + aggType
			cfg.OnOffsetsLoss = onLoss
			run := startRelay(t, cfg)
			run.waitStreaming(t)
			load := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 20, 2*time.Millisecond)
			waitCount(t, c, 300)
			// The state row records the newest position Kafka committed
			// (at most a status interval late): only then does a start
			// know the topic lost it.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				var recorded bool
				if err := conn.QueryRow(ctx, "SELECT offsets_lsn IS NOT NULL FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&recorded); err != nil {
					t.Fatal(err)
				}
				if recorded {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the state row never recorded a Kafka position")
				}
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			resp, err := kadm.NewClient(cl).DeleteTopic(ctx, cfg.OffsetsTopic)
			if err == nil {
				err = resp.Err
			}
			if err != nil {
				t.Fatal(err)
			}
			deleted := time.Now()
			var named, alarmed time.Duration
			var ended error
			for named == 0 || alarmed == 0 {
				if named == 0 && strings.Contains(run.relay.LastError(), cfg.OffsetsTopic) {
					named = time.Since(deleted)
					t.Logf("last error %s after the deletion: %s", named.Round(time.Millisecond), run.relay.LastError())
				}
				if alarmed == 0 && gaugeValue(t, run, "outbox_connector_topic_missing", cfg.OffsetsTopic) == 1 {
					alarmed = time.Since(deleted)
				}
				select {
				case ended = <-run.done:
					run.cancel = nil
				default:
				}
				if ended != nil {
					break
				}
				if time.Since(deleted) > offsetsNamedWithin {
					t.Fatalf("%v after the offsets topic was deleted under load: last error %q, outbox_connector_topic_missing{topic=%q} = %v; want both naming it",
						offsetsNamedWithin, run.relay.LastError(), cfg.OffsetsTopic, gaugeValue(t, run, "outbox_connector_topic_missing", cfg.OffsetsTopic))
				}
				time.Sleep(20 * time.Millisecond)
			}
			if named == 0 || alarmed == 0 {
				t.Fatalf("the connector ended (%v) before its last error and outbox_connector_topic_missing named the deleted offsets topic (%v, %v)", ended, named, alarmed)
			}
			t.Logf("the deleted offsets topic named %s (last error) and %s (outbox_connector_topic_missing) after the deletion", named.Round(time.Millisecond), alarmed.Round(time.Millisecond))
			var written []testenv.Event
			switch onLoss {
			case "fail":
				if ended == nil {
					select {
					case ended = <-run.done:
						run.cancel = nil
					case <-time.After(60 * time.Second):
						t.Fatal("with OUTBOX_ON_OFFSETS_LOSS=fail the connector still runs 60 s after its offsets topic was deleted")
					}
				}
				t.Logf("stopped %s after the deletion: %v", time.Since(deleted).Round(time.Millisecond), ended)
				var fe *fatal.Error
				if !errors.As(ended, &fe) || !strings.Contains(ended.Error(), "lost the connector's position") || !strings.Contains(ended.Error(), cfg.OffsetsTopic) || !strings.Contains(ended.Error(), "OUTBOX_ON_OFFSETS_LOSS=at-least-once") {
					t.Fatalf("stopped with %v; want a fatal error naming the lost position, the topic and OUTBOX_ON_OFFSETS_LOSS=at-least-once", ended)
				}
				written = load.Halt()
				// What the README says to do: start once with at-least-once.
				cfg.OnOffsetsLoss = "at-least-once"
				run = startRelay(t, cfg)
				run.waitStreaming(t)
			case "at-least-once":
				if ended != nil {
					t.Fatalf("with OUTBOX_ON_OFFSETS_LOSS=at-least-once the connector stopped: %v", ended)
				}
				time.Sleep(2 * time.Second)
				written = load.Halt()
			}
			c.WaitFor(t, written, 2*time.Minute)
			if v := gaugeValue(t, run, "outbox_connector_topic_missing", cfg.OffsetsTopic); v == 1 {
				t.Errorf("outbox_connector_topic_missing{topic=%q} still 1 once a start made sure of the topic", cfg.OffsetsTopic)
			}
			if err := run.stop(t); err != nil {
				t.Fatal(err)
			}
			dups := c.Verify(t, written)
			t.Logf("%d events committed under load, all delivered; %d duplicates (published again from the slot's position after the loss)", len(written), dups)
		})
	}
}
