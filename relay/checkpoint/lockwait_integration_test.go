package checkpoint

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestStateWriteLockWait (issue 35, item 10): a state write blocked by a
// lock another session holds on the state row fails after LockWait with
// an error that says so, instead of waiting for as long as the lock is
// held while holding the lease row FOR SHARE, which the lease's renewal
// waits for. The lock_timeout it sets does not outlive the write.
func TestStateWriteLockWait(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `INSERT INTO public.outbox_lease (slot_name, holder, token, expires_at) VALUES ('s1', 'a', 1, now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	st := State{Slot: "s1", SystemID: "x", Confirmed: 0x1000, SnapshotDone: true}
	if err := SaveState(ctx, conn, st, Fence{Token: 1}); err != nil {
		t.Fatal(err)
	}

	op := pg.Conn(t, "outbox")
	tx, err := op.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM public.outbox_connector_state WHERE slot_name = 's1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	// A renewal of the lease while the write waits: it must not wait for
	// the operator's lock too.
	renewed := make(chan time.Duration, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		lc, err := pgconnConnect(ctx, pg.DSN("outbox"))
		if err != nil {
			renewed <- -1
			return
		}
		defer lc.Close(ctx)
		began := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := lc.Exec(rctx, `UPDATE public.outbox_lease SET expires_at = now() + interval '1 minute' WHERE slot_name = 's1'`).Close(); err != nil {
			renewed <- -1
			return
		}
		renewed <- time.Since(began)
	}()

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	began := time.Now()
	st.Confirmed = 0x2000
	err = SaveState(wctx, conn, st, Fence{Token: 1})
	took := time.Since(began)
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || !strings.Contains(err.Error(), "pg_locks") {
		t.Fatalf("a write against a held row lock returned %v after %s; want a lock timeout (55P03) naming the lock", err, took)
	}
	if took > LockWait+2*time.Second {
		t.Errorf("the write waited %s; want about %s", took, LockWait)
	}
	t.Logf("the write gave up after %s: %v", took.Round(time.Millisecond), err)
	if d := <-renewed; d < 0 || d > LockWait+2*time.Second {
		t.Errorf("a renewal of the lease row during the write took %s (-1: failed); want it to wait at most for the write", d)
	}
	var setting string
	if err := conn.QueryRow(ctx, `SHOW lock_timeout`).Scan(&setting); err != nil || setting != "0" {
		t.Errorf("lock_timeout after the write: %q, %v; want the session's own (0)", setting, err)
	}

	// Released: the write passes.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := SaveState(ctx, conn, st, Fence{Token: 1}); err != nil {
		t.Fatalf("after the lock was released: %v", err)
	}
	if got, _, err := LoadState(ctx, conn, "s1"); err != nil || got.Confirmed != 0x2000 {
		t.Fatalf("state after the write: %+v, %v; want confirmed 0/2000", got, err)
	}
}

// pgconnConnect opens a plain connection (the lease's own session).
func pgconnConnect(ctx context.Context, dsn string) (*pgconn.PgConn, error) {
	return pgconn.Connect(ctx, dsn)
}
