package wal

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// holdNamedWithin bounds how long the watch takes to name a hold: its
// first look (Every, 1 s), plus the query.
const holdNamedWithin = 3 * time.Second

// holdRun is a WalsenderWatch running over a test's cluster, with what it
// said: the last hold, and the log.
type holdRun struct {
	t    *testing.T
	mu   sync.Mutex
	last Hold
	log  bytes.Buffer
	stop func()
}

func (r *holdRun) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t.Log(strings.TrimRight(string(p), "\n"))
	return r.log.Write(p)
}

func (r *holdRun) said() (Hold, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.log.String()
}

// startHoldWatch watches walsender pid, asking on a pool of dsn.
func startHoldWatch(t *testing.T, dsn string, pid uint32, slot string) *holdRun {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	r := &holdRun{t: t}
	w := &WalsenderWatch{DB: pool, PID: pid, Slot: slot, Log: slog.New(slog.NewTextHandler(r, nil)), WarnAfter: 2 * time.Second,
		Held: func(h Hold) {
			r.mu.Lock()
			r.last = h
			r.mu.Unlock()
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	r.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the watch ended with %v", err)
		}
		pool.Close()
	})
	t.Cleanup(r.stop)
	return r
}

// waitSaid waits until cond holds of what the watch said, or fails.
func (r *holdRun) waitSaid(within time.Duration, what string, cond func(Hold, string) bool) time.Duration {
	r.t.Helper()
	start := time.Now()
	for {
		h, log := r.said()
		if cond(h, log) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			r.t.Fatalf("%s: not within %v; last hold %+v", what, within, h)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func execAll(t *testing.T, conn *pgx.Conn, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := conn.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

func replicationConn(t *testing.T, pg *testenv.Postgres) *pgconn.PgConn {
	t.Helper()
	rconn, err := pgconn.Connect(context.Background(), pg.DSN("outbox")+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rconn.Close(context.Background()) })
	return rconn
}

// TestWalsenderWatchSlotCreation: CREATE_REPLICATION_SLOT waits for a
// prepared transaction and for a session idle in transaction, both begun
// before it and holding a transaction id. The watch, on a second
// connection, names both (gid, pid, xid) at its first look, warns after
// WarnAfter, and says the hold ended once they ended and the slot exists.
func TestWalsenderWatchSlotCreation(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"max_prepared_transactions": "5"}})
	ctx := context.Background()
	gid := fmt.Sprintf("forgotten-%d", time.Now().UnixNano())
	execAll(t, pg.Conn(t, "outbox"), "BEGIN", "CREATE TABLE held_a (x int)", "PREPARE TRANSACTION '"+gid+"'")
	idle := pg.Conn(t, "outbox")
	execAll(t, idle, "BEGIN", "CREATE TABLE held_b (x int)")
	idlePID := strconv.Itoa(int(idle.PgConn().PID()))
	rconn := replicationConn(t, pg)
	r := startHoldWatch(t, pg.DSN("outbox"), rconn.PID(), "held_slot")
	created := make(chan error, 1)
	go func() {
		_, _, err := CreateSlot(ctx, rconn, "held_slot", true, false)
		created <- err
	}()
	took := r.waitSaid(holdNamedWithin, "the hold named with the prepared transaction and the idle session", func(h Hold, _ string) bool {
		reason := h.Reason(time.Now())
		return h.Kind == HoldTransactions && strings.Contains(reason, strconv.Quote(gid)) && strings.Contains(reason, "session pid "+idlePID)
	})
	h, _ := r.said()
	t.Logf("named after %v: %s", took.Round(time.Millisecond), h.Reason(time.Now()))
	r.waitSaid(5*time.Second, "a warning naming the prepared transaction", func(_ Hold, log string) bool {
		return strings.Contains(log, "level=WARN") && strings.Contains(log, gid)
	})
	select {
	case err := <-created:
		t.Fatalf("the slot was created (%v) while the transactions were running", err)
	default:
	}
	execAll(t, pg.Conn(t, "outbox"), "COMMIT PREPARED '"+gid+"'")
	execAll(t, idle, "ROLLBACK")
	select {
	case err := <-created:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slot was not created 10 s after the transactions ended")
	}
	r.waitSaid(5*time.Second, "the end of the hold", func(h Hold, log string) bool {
		return h.Kind == "" && strings.Contains(log, "no longer holds")
	})
}

// TestWalsenderWatchStandby: PostgreSQL 17, synchronized_standby_slots
// naming a physical slot no standby streams from. A failover slot's
// walsender holds an insert back (wait event WaitForStandbyConfirmation);
// the watch names the standby's slot and warns, and nothing is sent. The
// setting emptied, the insert is sent and the hold ends.
func TestWalsenderWatchStandby(t *testing.T) {
	bin, err := testenv.PGVersionBinDir(17)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL 17: %v", err)
	}
	pg := testenv.StartPostgres(t, testenv.PGOptions{BinDir: bin})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	execAll(t, conn, "SELECT pg_create_physical_replication_slot('standby_held', true)",
		"ALTER SYSTEM SET synchronized_standby_slots = 'standby_held'", "SELECT pg_reload_conf()",
		"CREATE TABLE held_c (x int)", "CREATE PUBLICATION held_pub FOR TABLE held_c")
	rconn := replicationConn(t, pg)
	if _, _, err := CreateSlot(ctx, rconn, "held_failover", false, true); err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, rconn, "held_failover", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'held_pub'"}}); err != nil {
		t.Fatal(err)
	}
	var inserts sync.WaitGroup
	inserts.Add(1)
	var got sync.Once
	rctx, stopReading := context.WithCancel(ctx)
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			msg, err := rconn.ReceiveMessage(rctx)
			if err != nil {
				return
			}
			cd, ok := msg.(*pgproto3.CopyData)
			if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
				continue
			}
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err == nil && len(x.WALData) > 0 && x.WALData[0] == 'I' {
				got.Do(inserts.Done)
			}
		}
	}()
	defer func() {
		stopReading()
		<-read
	}()
	r := startHoldWatch(t, pg.DSN("outbox"), rconn.PID(), "held_failover")
	execAll(t, conn, "INSERT INTO held_c VALUES (1)")
	inserted := time.Now()
	took := r.waitSaid(holdNamedWithin, "the hold named with the standby's slot", func(h Hold, _ string) bool {
		return h.Kind == HoldStandby && strings.Contains(h.Reason(time.Now()), `"standby_held" (no standby streams from it`)
	})
	h, _ := r.said()
	t.Logf("named after %v: %s", took.Round(time.Millisecond), h.Reason(time.Now()))
	r.waitSaid(5*time.Second, "a warning naming the standby's slot", func(_ Hold, log string) bool {
		return strings.Contains(log, "level=WARN") && strings.Contains(log, "standby_held")
	})
	sent := make(chan struct{})
	go func() {
		inserts.Wait()
		close(sent)
	}()
	select {
	case <-sent:
		t.Fatal("the insert was sent although the standby never confirmed it: the test shows nothing")
	default:
	}
	t.Logf("held %v; emptying synchronized_standby_slots", time.Since(inserted).Round(time.Millisecond))
	execAll(t, conn, "ALTER SYSTEM RESET synchronized_standby_slots", "SELECT pg_reload_conf()")
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the insert was not sent 10 s after synchronized_standby_slots was emptied")
	}
	r.waitSaid(5*time.Second, "the end of the hold", func(h Hold, log string) bool {
		return h.Kind == "" && strings.Contains(log, "no longer holds")
	})
}
