package wal_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// TestSilenceWhileDecodingRewrite: on PostgreSQL 13 to 15 a walsender
// replaying a table rewrite (none of whose changes reach pgoutput) reads
// nothing from its client, so the silence probe goes unanswered for as long
// as the replay takes. Asked through another connection, the walsender is
// busy, and the stream waits: before, it ended with ErrSilent, and the
// next session replayed the same rewrite into the same silence, for ever.
// The event committed after the rewrite is delivered.
func TestSilenceWhileDecodingRewrite(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	ctx := context.Background()
	c := pg.Conn(t, "postgres")
	for _, q := range []string{
		"CREATE TABLE outbox (id int)",
		"CREATE PUBLICATION p FOR TABLE outbox",
		"CREATE TABLE big (id int, v int)",
		"INSERT INTO big SELECT g, g FROM generate_series(1, 3000000) g",
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}
	rcfg, err := pgconn.ParseConfig(pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	rcfg.RuntimeParams["replication"] = "database"
	rcfg.RuntimeParams["wal_sender_timeout"] = "1000"
	rc, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, rc, "s", "pgoutput", pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication})
	if err != nil {
		t.Fatal(err)
	}
	start, _ := pglogrepl.ParseLSN(res.ConsistentPoint)
	side := pg.Conn(t, "postgres")
	out := make(chan wal.Event, 100)
	got := make(chan time.Time, 100)
	go func() {
		for range out {
			got <- time.Now()
		}
	}()
	var busyAsked atomic.Int32
	s := &wal.Stream{Conn: rc, Slot: "s", Publication: "p", Schema: "public", Table: "outbox",
		Tracker: tracker.New(tracker.LSN(start)), Out: out, StatusInterval: 250 * time.Millisecond,
		StopGrace: time.Second, SilenceTimeout: time.Second,
		Position: wal.ConfirmFunc(func() uint64 { return 0 }),
		Busy: func(ctx context.Context) (bool, error) {
			busyAsked.Add(1)
			var busy bool
			err := side.QueryRow(ctx, `SELECT coalesce(wait_event_type, '') NOT IN ('Client', 'Activity') FROM pg_stat_get_activity($1)`, int32(rc.PID())).Scan(&busy)
			return busy, err
		},
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	done := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	go func() { done <- s.Run(runCtx, uint64(start)) }()
	// The stream owns rc until Run returns: stop it, then close.
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the stream did not stop within 30s")
		}
		rc.Close(context.Background())
	}()
	time.Sleep(time.Second)
	t0 := time.Now()
	if _, err := c.Exec(ctx, "ALTER TABLE big ALTER v TYPE bigint"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "INSERT INTO outbox VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		t.Logf("the event after a 3M-row rewrite delivered %s after the rewrite began; the walsender was asked %d times whether it was busy", at.Sub(t0), busyAsked.Load())
	case err := <-done:
		done <- err // for the deferred stop
		t.Fatalf("the stream ended %s after the rewrite began: %v (ErrSilent: %v)", time.Since(t0), err, errors.Is(err, wal.ErrSilent))
	case <-time.After(90 * time.Second):
		t.Fatal("nothing delivered 90s after the rewrite")
	}
}
