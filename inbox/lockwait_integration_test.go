package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// TestLockWaitIsNotCutByTxTimeout (review finding 3): a healthy handler
// waiting for a row lock that another transaction holds for longer than
// TxTimeout is not cut by the deadline and dead-lettered: each attempt's
// transaction gets a lock_timeout of a third of TxTimeout, so the wait
// fails first with 55P03, which is transient, and the event is applied once
// the lock is released. A third, because each lock acquisition has its own
// lock_timeout, and a row lock that several transactions wait for takes two
// (the tuple's lock, behind the waiter ahead, then the holder's transaction):
// the three groups here wait for the same row. A lower lock_timeout the session already has (the
// role's, the database's, the pool's) is kept; a higher one is lowered. Three
// groups read the same record: one on a pool with no lock_timeout, one with
// 100ms, one with 10s.
func TestLockWaitIsNotCutByTxTimeout(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE locked (k int PRIMARY KEY); INSERT INTO locked VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	holder, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SELECT k FROM locked WHERE k = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	e.produce(t, rec("ev-lock", "lock"), rec("ev-after", "ok"))
	const txTimeout = 1500 * time.Millisecond
	groups := []struct {
		name, sessionTimeout, want string
	}{
		{"none", "", "500ms"},       // a third of TxTimeout
		{"lower", "100ms", "100ms"}, // the session's own, lower: kept
		{"higher", "10s", "500ms"},  // above TxTimeout it could never fire first: lowered
	}
	var mu sync.Mutex
	seen := map[string]string{} // group -> lock_timeout inside the first attempt
	var consumers []*inbox.Consumer
	for _, g := range groups {
		pcfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		if g.sessionTimeout != "" {
			pcfg.ConnConfig.RuntimeParams["lock_timeout"] = g.sessionTimeout
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			if string(r.Value) == "lock" {
				var lt string
				if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&lt); err != nil {
					return err
				}
				mu.Lock()
				if _, ok := seen[g.name]; !ok {
					seen[g.name] = lt
				}
				mu.Unlock()
				if _, err := tx.Exec(ctx, `SELECT k FROM locked WHERE k = 1 FOR UPDATE`); err != nil {
					return fmt.Errorf("lock the row: %w", err)
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, g.name+"/"+inbox.Header(r, "id"))
			return err
		}
		cfg := e.quiet()
		cfg.Group += "-" + g.name
		cfg.TxTimeout = txTimeout
		c, err := inbox.New(pool, h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, c)
		stop := run(t, c)
		defer stop()
	}
	waitFor(t, "every group waiting for the lock", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(groups)
	})
	time.Sleep(6 * time.Second) // 4 times TxTimeout: MaxAttempts cuts and more
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for i, g := range groups {
		c := consumers[i]
		waitFor(t, g.name+": ev-after handled", 30*time.Second, func() bool { return effectsOf(t, e, g.name+"/ev-after") == 1 })
		if s := c.Stats(); s.DeadLettered != 0 {
			t.Errorf("group with lock_timeout %q: stats %+v; a healthy handler waiting for a lock was dead-lettered", g.sessionTimeout, s)
		}
		if n := effectsOf(t, e, g.name+"/ev-lock"); n != 1 {
			t.Errorf("group with lock_timeout %q: ev-lock applied %d times, want once", g.sessionTimeout, n)
		}
		mu.Lock()
		got := seen[g.name]
		mu.Unlock()
		if got != g.want {
			t.Errorf("group with session lock_timeout %q: the handler's transaction had lock_timeout %q, want %q", g.sessionTimeout, got, g.want)
		}
	}
}
