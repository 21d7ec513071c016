package relay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// pgMajor starts a throwaway cluster of PostgreSQL major (Debian's where
// installed, else zonky's build).
func pgMajor(t *testing.T, major int) *testenv.Postgres {
	t.Helper()
	bin, err := testenv.PGVersionBinDir(major)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL %d: %v", major, err)
	}
	return testenv.StartPostgres(t, testenv.PGOptions{BinDir: bin})
}

// slotConfirmed reads the slot's confirmed_flush_lsn.
func slotConfirmed(t testing.TB, conn *pgx.Conn, slot string) uint64 {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s); err != nil {
		t.Fatalf("read slot %s: %v", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(lsn)
}

// currentLSN reads the server's current WAL insert position.
func currentLSN(t testing.TB, conn *pgx.Conn) uint64 {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(lsn)
}

// waitFatal waits for the relay to stop with a fatal.Error and returns it;
// on a timeout it reports what the slot and the consumer show.
func waitFatal(t *testing.T, run *running, within time.Duration, state func() string) error {
	t.Helper()
	select {
	case err := <-run.done:
		run.cancel = nil
		if !fatal.Is(err) {
			t.Fatalf("relay stopped with %v; want a fatal.Error", err)
		}
		return err
	case <-time.After(within):
		t.Fatalf("relay did not stop within %s; %s (reconnects %s)", within, state(), metricValue(t, run, "outbox_connector_reconnects_total"))
		return nil
	}
}

// TestPublicationDroppedWhileStopped (issue 13, review finding 2): the
// publication is dropped while the connector is stopped and events are
// written. The slot exists, so the next start must not create the
// publication: PostgreSQL decodes each change with the publication as it
// was when the change was written, so PostgreSQL 18 would skip the events
// written while it was missing (the connector confirmed them unpublished),
// and 13 to 17 fail the stream at the first of them at every session (a
// loop). The start stops with a fatal.Error naming the slot, its confirmed
// position and the way out, before anything moves the slot; following the
// way out (drop the slot, start once with OUTBOX_ACCEPT_SLOT_RESET=true)
// publishes every event, those written while the publication was missing
// included, from the table.
func TestPublicationDroppedWhileStopped(t *testing.T) {
	for _, major := range []int{18, 15} {
		t.Run(fmt.Sprintf("PG%d", major), func(t *testing.T) {
			pg := pgMajor(t, major)
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("pubdrop")
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			w := testenv.NewWriter()

			run := startRelay(t, cfg)
			run.waitStreaming(t)
			w.Write(t, ctx, conn, aggType, 20, 4, 5)
			c.WaitFor(t, w.Events, 30*time.Second)
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			before := slotConfirmed(t, conn, cfg.Slot)

			if _, err := conn.Exec(ctx, "DROP PUBLICATION outbox_pub"); err != nil {
				t.Fatal(err)
			}
			w.Write(t, ctx, conn, aggType, 3, 3, 1)
			missing := w.Snapshot()[20:]

			run = startRelay(t, cfg)
			err := waitFatal(t, run, 30*time.Second, func() string {
				return "slot confirmed_flush_lsn " + wal.FormatLSN(before) + " -> " + wal.FormatLSN(slotConfirmed(t, conn, cfg.Slot)) +
					", " + strconv.Itoa(delivered(c, missing)) + " of the 3 events written while the publication was missing delivered"
			})
			for _, want := range []string{`"outbox_pub"`, `"outbox_slot"`, wal.FormatLSN(before), "CREATE PUBLICATION", "pg_drop_replication_slot", "OUTBOX_ACCEPT_SLOT_RESET=true"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
			t.Logf("stopped: %v", err)
			if after := slotConfirmed(t, conn, cfg.Slot); after != before {
				t.Errorf("the slot moved from %s to %s", wal.FormatLSN(before), wal.FormatLSN(after))
			}
			var exists bool
			if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outbox_pub')`).Scan(&exists); err != nil || exists {
				t.Errorf("publication re-created for the existing slot (exists %v, %v)", exists, err)
			}

			// The way out the error gives.
			if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot('outbox_slot')"); err != nil {
				t.Fatal(err)
			}
			cfg.AcceptSlotReset = true
			run = startRelay(t, cfg)
			c.WaitFor(t, w.Events, 60*time.Second)
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			dups := c.Verify(t, w.Events)
			t.Logf("PostgreSQL %s: all %d events delivered in order after the way out, %d duplicates (the snapshot republishes the table)", pg.Version, len(w.Events), dups)
		})
	}
}

// delivered counts how many of want the consumer has, by id.
func delivered(c *testenv.Consumer, want []testenv.Event) int {
	ids := map[string]bool{}
	for _, r := range c.Records() {
		ids[testenv.Header(r, "id")] = true
	}
	n := 0
	for _, e := range want {
		if ids[e.ID] {
			n++
		}
	}
	return n
}

// TestPublicationMissingMidStream (issue 13, review findings 1 and 2): the
// publication is dropped, events are written, and it is created again, so
// that the start check passes: on PostgreSQL 15 while the connector is
// stopped, on 18 while it streams. The slot still has the changes written
// while it was missing, which cannot be decoded through it: 15 fails the
// stream at the first of them (SQLSTATE 42704), which was retried forever
// (a wedge that never counted as a stall), 18 skips them with a warning,
// and the connector confirmed them unpublished. Either way the stream must
// stop with a fatal.Error that names the publication and the way out, before
// the slot's confirmed position passes the first of those events.
func TestPublicationMissingMidStream(t *testing.T) {
	for _, tc := range []struct {
		major   int
		running bool
	}{{15, false}, {18, true}} {
		name := fmt.Sprintf("PG%d/stopped", tc.major)
		if tc.running {
			name = fmt.Sprintf("PG%d/streaming", tc.major)
		}
		t.Run(name, func(t *testing.T) {
			pg := pgMajor(t, tc.major)
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("pubmid")
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			w := testenv.NewWriter()

			run := startRelay(t, cfg)
			run.waitStreaming(t)
			w.Write(t, ctx, conn, aggType, 20, 4, 5)
			c.WaitFor(t, w.Events, 30*time.Second)
			if !tc.running {
				if err := run.stop(t); err != nil {
					t.Fatalf("relay stopped with %v", err)
				}
			}
			if _, err := conn.Exec(ctx, "DROP PUBLICATION outbox_pub"); err != nil {
				t.Fatal(err)
			}
			gap := currentLSN(t, conn)
			w.Write(t, ctx, conn, aggType, 3, 3, 1)
			missing := w.Snapshot()[20:]
			if _, err := conn.Exec(ctx, "CREATE PUBLICATION outbox_pub FOR TABLE public.outbox WITH (publish = 'insert')"); err != nil {
				t.Fatal(err)
			}
			// Written after it exists again: decodable, but behind the gap.
			w.Write(t, ctx, conn, aggType, 2, 2, 1)
			if !tc.running {
				run = startRelay(t, cfg)
			}
			err := waitFatal(t, run, 30*time.Second, func() string {
				return "slot confirmed_flush_lsn " + wal.FormatLSN(slotConfirmed(t, conn, cfg.Slot)) + " (the gap begins at " + wal.FormatLSN(gap) + "), " +
					strconv.Itoa(delivered(c, missing)) + " of the 3 events written while the publication was missing delivered, " +
					strconv.Itoa(delivered(c, w.Snapshot()[23:])) + " of the 2 after it"
			})
			for _, want := range []string{`"outbox_pub"`, `"outbox_slot"`, "pg_drop_replication_slot", "OUTBOX_ACCEPT_SLOT_RESET=true"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
			t.Logf("stopped: %v", err)
			if after := slotConfirmed(t, conn, cfg.Slot); after > gap {
				t.Errorf("the slot confirmed %s, past the first event written while the publication was missing (after %s)", wal.FormatLSN(after), wal.FormatLSN(gap))
			}
			if n := delivered(c, missing); n != 0 {
				t.Errorf("%d of the events written while the publication was missing in Kafka; want none (they cannot be decoded)", n)
			}
		})
	}
}
