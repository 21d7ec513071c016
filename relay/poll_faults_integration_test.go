package relay

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// Poll mode's failure paths, each found by the adversarial review of the
// first version, each test failing then.

func insertPoll(t testing.TB, conn *pgx.Conn, aggType, agg string) string {
	t.Helper()
	id := uuid.NewString()
	if _, err := conn.Exec(context.Background(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'T', '{}')`, id, aggType, agg); err != nil {
		t.Fatal(err)
	}
	return id
}

// waitPollStalled waits until the relay's stall check says want.
func waitPollStalled(t testing.TB, r *running, want bool, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, why := r.relay.Stalled()
		if st == want {
			return why
		}
		if time.Now().After(deadline) {
			t.Fatalf("stalled=%v after %s, want %v (%s)", st, within, want, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPollNullKey: a row whose key column is NULL is in a bucket like any
// other (it hashes as ”): published, as the WAL mode publishes it. It was
// in none: never read, never marked, kept forever.
func TestPollNullKey(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox ALTER aggregateid DROP NOT NULL`); err != nil {
		t.Fatal(err)
	}
	aggType := uniqueType("nullkey")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	nullID := uuid.NewString()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, NULL, 'T', '{}')`, nullID, aggType); err != nil {
		t.Fatal(err)
	}
	after := insertPoll(t, conn, aggType, "k")
	run := startRelay(t, pollConfig(t, pg.DSN("outbox"), brokers))
	run.waitPolling(t)
	waitMarked(t, conn, []string{nullID, after})
	waitCount(t, c, 2)
	if !hasID(c.Records(), nullID) {
		t.Errorf("the NULL-key event %s was not published", nullID)
	}
}

// TestPollMarkDiscarded: an UPDATE of published_at that the database
// discards without an error (a BEFORE UPDATE trigger returning NULL, a
// row-level security policy) stops the connector, saying so, after
// publishing the batch once. It read and published the batch again at every
// poll (757 records of one event in 5 s).
func TestPollMarkDiscarded(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `CREATE FUNCTION no_upd() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER no_upd BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION no_upd()`); err != nil {
		t.Fatal(err)
	}
	aggType := uniqueType("noupd")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	insertPoll(t, conn, aggType, "k")
	run := startRelay(t, pollConfig(t, pg.DSN("outbox"), brokers))
	select {
	case err := <-run.done:
		if !fatal.Is(err) || !strings.Contains(err.Error(), "could not mark rows published") {
			t.Fatalf("Run returned %v; want a fatal error saying the rows could not be marked", err)
		}
		run.done <- err
	case <-time.After(60 * time.Second):
		t.Fatal("the connector went on although it cannot mark rows")
	}
	time.Sleep(time.Second)
	if n := c.Count(); n != 1 {
		t.Errorf("%d records of one event; want it published once", n)
	}
}

// TestPollMarkRefused: marks the server refuses for a while (a read-only
// transaction: a full disk on a managed database, a switchover) are tried
// again with backoff on the same session: the batch Kafka has is not
// published again, the stall is said, and once the server takes the marks
// the line goes on. Each session published the batch again before
// (30 records of 5 events in 20 s), and said nothing.
func TestPollMarkRefused(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `CREATE TABLE mark_refused (on_ bool);
CREATE FUNCTION refuse_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM mark_refused) THEN
    RAISE EXCEPTION 'cannot execute UPDATE in a read-only transaction' USING ERRCODE = 'read_only_sql_transaction';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_mark BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_mark()`); err != nil {
		t.Fatal(err)
	}
	aggType := uniqueType("ro")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := pollConfig(t, pg.DSN("outbox"), brokers)
	cfg.StallTimeout = 3 * time.Second
	run := startRelay(t, cfg)
	run.waitPolling(t)
	if _, err := conn.Exec(ctx, `INSERT INTO mark_refused VALUES (true)`); err != nil {
		t.Fatal(err)
	}
	// One transaction: one batch. The line waits behind it while its marks
	// are refused.
	var ids []string
	if err := conn.QueryRow(ctx, `WITH i AS (INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), $1, 'agg-' || g, 'T', '{}' FROM generate_series(1, 5) g RETURNING id::text)
		SELECT array_agg(id) FROM i`, aggType).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	waitCount(t, c, 5)
	why := waitPollStalled(t, run, true, 30*time.Second)
	t.Logf("stalled while marks are refused: %s", why)
	if n := c.Count(); n != 5 {
		t.Errorf("%d records of 5 events while marks were refused; want each published once", n)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM mark_refused`); err != nil {
		t.Fatal(err)
	}
	waitMarked(t, conn, ids)
	waitPollStalled(t, run, false, 30*time.Second)
	if n := c.Count(); n != 5 {
		t.Errorf("%d records of 5 events; want each published once", n)
	}
}

// TestPollReadOnlyRole: a role whose transactions are read-only cannot
// mark: a session says so at its start, before it reads anything, and
// tries again with backoff (nothing published, the stall said); once the
// role may write, every event is delivered once.
func TestPollReadOnlyRole(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `GRANT outbox_poller TO postgres; ALTER ROLE outbox_poller SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	aggType := uniqueType("rorole")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	var ids []string
	for i := range 5 {
		ids = append(ids, insertPoll(t, conn, aggType, fmt.Sprint("agg-", i)))
	}
	cfg := pollConfig(t, pg.DSNUser("outbox", "outbox_poller"), brokers)
	cfg.StallTimeout = 3 * time.Second
	run := startRelay(t, cfg)
	why := waitPollStalled(t, run, true, 30*time.Second)
	t.Logf("stalled: %s", why)
	if n := c.Count(); n != 0 {
		t.Errorf("%d records published by a role that cannot mark them", n)
	}
	if _, err := conn.Exec(ctx, `ALTER ROLE outbox_poller RESET default_transaction_read_only`); err != nil {
		t.Fatal(err)
	}
	waitMarked(t, conn, ids)
	waitCount(t, c, 5)
	time.Sleep(time.Second)
	if n := c.Count(); n != 5 {
		t.Errorf("%d records of 5 events", n)
	}
}

// freezer is a TCP proxy whose connections can be frozen: bytes stop
// flowing both ways but no socket closes (a network partition, a hung
// middlebox, a paused VM, as the server sees it).
type freezer struct {
	addr   string
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{addr: ln.Addr().String()}
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, s)
			f.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					for f.frozen.Load() {
						time.Sleep(50 * time.Millisecond) // hold the bytes, keep the socket
					}
					if n > 0 {
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						if err != io.EOF {
							dst.Close()
						}
						return
					}
				}
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return f
}

// TestPollFrozenOwner: an instance cut off from PostgreSQL without the
// server noticing (its connection frozen, the sockets open) keeps its
// buckets' locks as long as the server keeps its session; after
// OUTBOX_LEASE_TTL of silence the other instance ends that session and
// takes its buckets: every event is delivered. Before, none was (0 of 20 in
// 15 s), and both instances said they were ready.
func TestPollFrozenOwner(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("frozen")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)

	fz := startFreezer(t, fmt.Sprintf("127.0.0.1:%d", pg.Port))
	cfg1 := pollConfig(t, fmt.Sprintf("postgres://postgres@%s/outbox?sslmode=disable", fz.addr), brokers)
	cfg1.LeaseTTL = 3 * time.Second
	run1 := startRelay(t, cfg1)
	run1.waitPolling(t)
	if n := run1.relay.pollOwned.Load(); n != 16 {
		t.Fatalf("the first instance owns %d buckets, want 16", n)
	}
	fz.frozen.Store(true)
	cfg2 := pollConfig(t, pg.DSN("outbox"), brokers)
	cfg2.LeaseTTL = 3 * time.Second
	run2 := startRelay(t, cfg2)
	var ids []string
	for i := range 20 {
		ids = append(ids, insertPoll(t, conn, aggType, fmt.Sprint("agg-", i)))
	}
	start := time.Now()
	waitMarked(t, conn, ids)
	waitCount(t, c, 20)
	t.Logf("all 20 events delivered %s after the first instance froze; the second owns %d buckets", time.Since(start).Round(100*time.Millisecond), run2.relay.pollOwned.Load())
	fz.frozen.Store(false)
}

// TestPollSilentMember: a session that joined the readers and then ran
// nothing (stuck, or a zombie the server still holds) no longer holds the
// others at the floor of their shares, leaving buckets nobody reads: after
// OUTBOX_LEASE_TTL of silence it is ended. Before, 20 of 64 events stayed
// unpublished, and both instances said they were ready.
func TestPollSilentMember(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	zombie := pg.Conn(t, "outbox")
	if _, err := zombie.Exec(ctx, `SELECT pg_advisory_lock($1, pg_backend_pid())`, pollLockKey(`outbox-poll-readers:"public"."outbox"`)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		cfg := pollConfig(t, pg.DSN("outbox"), brokers)
		cfg.LeaseTTL = 3 * time.Second
		startRelay(t, cfg)
	}
	aggType := uniqueType("silent")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	var ids []string
	for i := range 64 {
		ids = append(ids, insertPoll(t, conn, aggType, fmt.Sprint("agg-", i)))
	}
	waitMarked(t, conn, ids)
	waitCount(t, c, 64)
	if err := zombie.Ping(ctx); err == nil {
		t.Error("the silent member's session is still there")
	}
}

// pollLockKey is relay/poll's lockKey (FNV-1a, non-negative).
func pollLockKey(name string) int32 {
	h := uint32(2166136261)
	for _, c := range []byte(name) {
		h ^= uint32(c)
		h *= 16777619
	}
	return int32(h & 0x7fffffff)
}

// TestPollProducerFatal: a producer that stops for good (Kafka refuses the
// dead-letter topic's name) stops poll mode with its reason, whatever the
// loop was doing when it stopped: the loop's own "context canceled" is not
// the cause, and taken for one it would reconnect forever.
func TestPollProducerFatal(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	cfg := pollConfig(t, pg.DSN("outbox"), brokers)
	cfg.DLQTopic = "no spaces allowed"
	run := startRelay(t, cfg)
	select {
	case err := <-run.done:
		if !fatal.Is(err) || !strings.Contains(err.Error(), "OUTBOX_DLQ_TOPIC") {
			t.Fatalf("Run returned %v; want the fatal refusal of the dead-letter topic", err)
		}
		run.done <- err
	case <-time.After(60 * time.Second):
		t.Fatal("poll mode went on with a dead-letter topic Kafka refuses")
	}
}
