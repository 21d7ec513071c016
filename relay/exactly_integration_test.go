package relay

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/offsets"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestExactlyOnceCrashReplay: sessions fail right after Kafka committed a
// transaction (its records and its position are in Kafka, nothing of it is
// acked or confirmed to PostgreSQL), three times under load (the reconnect
// backoff doubles each time), and twice right before a commit (the
// transaction's records are in the log, then aborted); each next session
// reads the slot again from the confirmed position, skips what the position
// covers, and a read_committed consumer sees every event once, in order.
// Without the position every failure after a commit publishes the whole
// transaction again. A read_uncommitted consumer sees the aborted records
// too: what the README tells consumers.
func TestExactlyOnceCrashReplay(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	aggType := uniqueType("eocrash")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.OffsetsTopic = "offsets." + aggType
	const failures, aborts = 3, 2
	var commits, failed, flushed, aborted atomic.Int64
	hook := func(s fault.Step) error {
		if s == fault.AfterKafkaCommit && commits.Add(1)%7 == 0 && failed.Load() < failures {
			failed.Add(1)
			return errors.New("injected: the session fails after Kafka committed")
		}
		if s == fault.BeforeKafkaCommit && flushed.Add(1)%11 == 0 && aborted.Load() < aborts {
			aborted.Add(1)
			return errors.New("injected: the session fails before Kafka commits")
		}
		return nil
	}
	run := startRelayFaults(t, cfg, route.DefaultConfig(), hook)
	run.waitStreaming(t)
	lw := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 50, 5*time.Millisecond)
	deadline := time.Now().Add(2 * time.Minute)
	for (failed.Load() < failures || aborted.Load() < aborts) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	want := lw.Halt()
	c.WaitFor(t, want, 2*time.Minute)
	skipped := metricValue(t, run, "outbox_connector_exactly_once_skipped_events_total")
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	dups := c.Verify(t, want)
	t.Logf("%d events, %d sessions failed after a Kafka commit; %s events skipped as already in Kafka; %d duplicates", len(want), failed.Load(), skipped, dups)
	if failed.Load() < failures || aborted.Load() < aborts {
		t.Errorf("only %d failures after a commit and %d before one injected", failed.Load(), aborted.Load())
	}
	// read_uncommitted: the aborted transactions' records are there too.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics("outbox.event."+aggType),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	uncommitted := 0
	for end := time.Now().Add(30 * time.Second); uncommitted <= c.Count() && time.Now().Before(end); {
		pctx, cancel := context.WithTimeout(context.Background(), time.Second)
		uncommitted += cl.PollFetches(pctx).NumRecords()
		cancel()
	}
	t.Logf("read_committed: %d records; read_uncommitted: %d so far (the aborted transactions' records)", c.Count(), uncommitted)
	if uncommitted <= c.Count() {
		t.Errorf("a read_uncommitted consumer saw %d records, no more than read_committed's %d: the aborted records are not visible, and the test shows nothing", uncommitted, c.Count())
	}
	if dups != 0 {
		t.Errorf("%d duplicates; want 0", dups)
	}
	if skipped == ":0" || skipped == "" {
		t.Errorf("no event was skipped (%q) although every failure left a committed transaction unconfirmed", skipped)
	}
}

// TestOffsetsTopicLost: the offsets topic deleted, the slot's position
// deleted from it (a tombstone: a compacted topic refuses DeleteRecords),
// or set back (an older copy of the topic), between two runs: the next start refuses with the choices, naming
// OUTBOX_ON_OFFSETS_LOSS; with OUTBOX_ON_OFFSETS_LOSS=at-least-once it
// continues from the slot's position, and a start after that is normal
// again (a new history of positions).
func TestOffsetsTopicLost(t *testing.T) {
	for _, how := range []string{"deleted", "tombstone", "behind"} {
		t.Run(how, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("eolost")
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			cfg.OffsetsTopic = "offsets." + aggType
			w := testenv.NewWriter()
			run := startRelay(t, cfg)
			run.waitStreaming(t)
			w.Write(t, ctx, conn, aggType, 100, 10, 10)
			c.WaitFor(t, w.Snapshot(), time.Minute)
			// The state row records the newest position Kafka committed
			// with its next write: wait for it.
			deadline := time.Now().Add(30 * time.Second)
			for {
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
				w.Write(t, ctx, conn, aggType, 1, 1, 1)
				time.Sleep(300 * time.Millisecond)
			}
			if err := run.stop(t); err != nil {
				t.Fatal(err)
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			adm := kadm.NewClient(cl)
			switch how {
			case "deleted":
				if _, err := adm.DeleteTopic(ctx, cfg.OffsetsTopic); err != nil {
					t.Fatal(err)
				}
			case "tombstone", "behind":
				var sys string
				var epoch int64
				if err := conn.QueryRow(ctx, "SELECT system_identifier, offsets_epoch FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&sys, &epoch); err != nil {
					t.Fatal(err)
				}
				key := offsets.Key{SystemID: sys, Database: "outbox", Slot: "outbox_slot"}
				rec := &kgo.Record{Topic: cfg.OffsetsTopic, Key: key.Bytes()}
				if how == "behind" {
					// An older copy of the topic: a position of the same
					// history, behind what the state row recorded.
					rec.Value = offsets.Position{Epoch: epoch, Timeline: 1, Commit: 1}.Value()
				}
				if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			w.Write(t, ctx, conn, aggType, 20, 5, 5)
			run = startRelay(t, cfg)
			select {
			case err = <-run.done:
				run.cancel = nil
			case <-time.After(60 * time.Second):
				t.Fatal("the connector started although its offsets topic lost the position")
			}
			var fe *fatal.Error
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), "lost the connector's position") || !strings.Contains(err.Error(), "OUTBOX_ON_OFFSETS_LOSS=at-least-once") {
				t.Fatalf("start after the offsets topic was %s: %v; want a fatal error naming the loss and OUTBOX_ON_OFFSETS_LOSS", how, err)
			}
			t.Logf("refused with: %v", err)
			cfg.OnOffsetsLoss = "at-least-once"
			run = startRelay(t, cfg)
			run.waitStreaming(t)
			c.WaitFor(t, w.Snapshot(), time.Minute)
			if err := run.stop(t); err != nil {
				t.Fatal(err)
			}
			cfg.OnOffsetsLoss = "fail"
			w.Write(t, ctx, conn, aggType, 20, 5, 5)
			run = startRelay(t, cfg)
			run.waitStreaming(t)
			c.WaitFor(t, w.Snapshot(), time.Minute)
			if err := run.stop(t); err != nil {
				t.Fatalf("a start after the at-least-once one: %v", err)
			}
			c.Verify(t, w.Snapshot())
		})
	}
}
