package relay

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// TestPublicationMissingQuietServer (review 3, finding 2): PostgreSQL 18
// tells that it skipped the publication only by a WARNING, which a server
// sends only at client_min_messages warning or below. With error set on the
// database, the role or in the DSN's options, the skip was silent and the
// connector confirmed the skipped events unpublished. The replication
// connection asks for notices itself, so the stream stops with the
// missing-publication fatal.Error before the slot's confirmed position
// passes the first event written while the publication was missing.
func TestPublicationMissingQuietServer(t *testing.T) {
	for _, quiet := range []string{"database", "role", "dsn"} {
		t.Run(quiet, func(t *testing.T) {
			pg := pgMajor(t, 18)
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			dsn := pg.DSN("outbox")
			switch quiet {
			case "database":
				if _, err := conn.Exec(ctx, "ALTER DATABASE outbox SET client_min_messages = error"); err != nil {
					t.Fatal(err)
				}
			case "role":
				if _, err := conn.Exec(ctx, "ALTER ROLE postgres SET client_min_messages = error"); err != nil {
					t.Fatal(err)
				}
			case "dsn":
				dsn += "&options=-c%20client_min_messages%3Derror"
			}
			aggType := uniqueType("pubquiet")
			cfg := testConfig(t, dsn, brokers)
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			w := testenv.NewWriter()

			run := startRelay(t, cfg)
			run.waitStreaming(t)
			w.Write(t, ctx, conn, aggType, 10, 2, 5)
			c.WaitFor(t, w.Events, 30*time.Second)
			if _, err := conn.Exec(ctx, "DROP PUBLICATION outbox_pub"); err != nil {
				t.Fatal(err)
			}
			gap := currentLSN(t, conn)
			w.Write(t, ctx, conn, aggType, 3, 3, 1)
			missing := w.Snapshot()[10:]
			if _, err := conn.Exec(ctx, "CREATE PUBLICATION outbox_pub FOR TABLE public.outbox WITH (publish = 'insert')"); err != nil {
				t.Fatal(err)
			}
			w.Write(t, ctx, conn, aggType, 2, 2, 1)
			err := waitFatal(t, run, 30*time.Second, func() string {
				return "slot confirmed_flush_lsn " + wal.FormatLSN(slotConfirmed(t, conn, cfg.Slot)) + " (the gap begins at " + wal.FormatLSN(gap) + "), " +
					strconv.Itoa(delivered(c, missing)) + " of the 3 events written while the publication was missing delivered, " +
					strconv.Itoa(delivered(c, w.Snapshot()[13:])) + " of the 2 after it"
			})
			for _, want := range []string{`"outbox_pub"`, `"outbox_slot"`, "OUTBOX_ACCEPT_SLOT_RESET=true"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
			if after := slotConfirmed(t, conn, cfg.Slot); after > gap {
				t.Errorf("the slot confirmed %s, past the first event written while the publication was missing (after %s)", wal.FormatLSN(after), wal.FormatLSN(gap))
			}
			if n := delivered(c, missing); n != 0 {
				t.Errorf("%d of the events written while the publication was missing in Kafka; want none", n)
			}
		})
	}
}
