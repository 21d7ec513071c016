package lease

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// candidate runs an elector whose lead function records its terms and
// waits until its term ends or it is told to step down.
type candidate struct {
	e      *Elector
	cancel context.CancelFunc
	done   chan error

	mu    sync.Mutex
	terms []*Term
	ended map[int64]time.Time // token -> when lead saw the term end
}

func startCandidate(t *testing.T, dsn, holder string, ttl time.Duration) *candidate {
	t.Helper()
	return startCandidateCfg(t, Config{DSN: dsn, Slot: "s1", Holder: holder, TTL: ttl, Poll: 200 * time.Millisecond})
}

// startCandidateCfg is startCandidate with the whole configuration.
func startCandidateCfg(t *testing.T, cfg Config) *candidate {
	t.Helper()
	c := &candidate{done: make(chan error, 1), ended: map[int64]time.Time{}}
	cfg.Log = slog.New(slog.NewTextHandler(testLog{t, cfg.Holder}, nil))
	c.e = New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		c.done <- c.e.Run(ctx, func(ctx context.Context, term *Term) error {
			c.mu.Lock()
			c.terms = append(c.terms, term)
			c.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-term.Context().Done():
				c.mu.Lock()
				c.ended[term.Token] = time.Now()
				c.mu.Unlock()
				return term.Err()
			}
		})
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

func (c *candidate) stop(t *testing.T) {
	t.Helper()
	if c.cancel == nil {
		return
	}
	c.cancel()
	c.cancel = nil
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("elector stopped with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("elector did not stop within 10s")
	}
}

// leading returns the term this candidate leads in, if any.
func (c *candidate) leading() *Term {
	if t := c.e.Current(); t != nil && t.Valid() {
		return t
	}
	return nil
}

func waitLeader(t *testing.T, timeout time.Duration, cs ...*candidate) (*candidate, *Term) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, c := range cs {
			if term := c.leading(); term != nil {
				return c, term
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no candidate led within %s", timeout)
	return nil, nil
}

type testLog struct {
	t    testing.TB
	name string
}

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(w.name + ": " + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func leaseRow(t *testing.T, conn *pgx.Conn) (holder string, token int64, pid int32) {
	t.Helper()
	err := conn.QueryRow(context.Background(), "SELECT holder, token, coalesce(holder_pid, 0) FROM outbox_lease WHERE slot_name = 's1'").Scan(&holder, &token, &pid)
	if err != nil {
		t.Fatal(err)
	}
	return
}

// TestLeaseAcquireRenewRelease: a lone candidate leads at once (token 1),
// keeps the lease well past its TTL by renewing, and on release a standby
// takes over at once with the next token.
func TestLeaseAcquireRenewRelease(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	conn := pg.Conn(t, "outbox")
	const ttl = time.Second
	start := time.Now()
	a := startCandidate(t, pg.DSN("outbox"), "a", ttl)
	_, term := waitLeader(t, 5*time.Second, a)
	if term.Token != 1 || term.Reason != "free" {
		t.Fatalf("first term: token %d reason %q; want 1, free", term.Token, term.Reason)
	}
	t.Logf("lone candidate led %s after start", time.Since(start).Round(time.Millisecond))
	b := startCandidate(t, pg.DSN("outbox"), "b", ttl)
	time.Sleep(3 * ttl)
	if a.leading() != term {
		t.Fatalf("a lost its term %d while renewing: %v", term.Token, term.Err())
	}
	if b.leading() != nil {
		t.Fatal("b leads while a holds the lease")
	}
	if h, tok, _ := leaseRow(t, conn); h != "a" || tok != 1 {
		t.Fatalf("lease row: holder %q token %d; want a, 1", h, tok)
	}
	released := time.Now()
	a.stop(t)
	_, bt := waitLeader(t, 5*time.Second, b)
	took := time.Since(released)
	t.Logf("b took over %s after a released (reason %s)", took.Round(time.Millisecond), bt.Reason)
	if bt.Token != 2 || bt.Reason != "released" {
		t.Errorf("b's term: token %d reason %q; want 2, released", bt.Token, bt.Reason)
	}
	if took > ttl/2 {
		t.Errorf("b took %s to take a released lease; want at once", took)
	}
	if !errors.Is(term.Err(), errReleased) {
		t.Errorf("a's term ended with %v; want released", term.Err())
	}
}

// TestLeaseHolderSessionEnds: when the leader's lease session is terminated
// (its process killed, its connection cut), the leader's term ends at once
// and a standby takes over without waiting for the expiry.
func TestLeaseHolderSessionEnds(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	conn := pg.Conn(t, "outbox")
	const ttl = 10 * time.Second
	a := startCandidate(t, pg.DSN("outbox"), "a", ttl)
	_, at := waitLeader(t, 5*time.Second, a)
	b := startCandidate(t, pg.DSN("outbox"), "b", ttl)
	c := startCandidate(t, pg.DSN("outbox"), "c", ttl)
	time.Sleep(500 * time.Millisecond)
	_, _, pid := leaseRow(t, conn)
	cut := time.Now()
	if _, err := conn.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	who, nt := waitLeader(t, 5*time.Second, b, c)
	took := time.Since(cut)
	a.mu.Lock()
	endedAt, ended := a.ended[at.Token]
	a.mu.Unlock()
	if !ended || !at.Lost() {
		t.Fatalf("a's term did not end as lost: %v", at.Err())
	}
	t.Logf("a saw the loss %s after the cut; %s took over %s after it (reason %s, token %d)",
		endedAt.Sub(cut).Round(time.Millisecond), who.e.cfg.Holder, took.Round(time.Millisecond), nt.Reason, nt.Token)
	if took > 2*time.Second {
		t.Errorf("takeover took %s after the leader's session ended; want well under the TTL (%s)", took, ttl)
	}
	if nt.Reason != "holder session ended" || nt.Token != at.Token+1 {
		t.Errorf("new term: reason %q token %d; want holder session ended, %d", nt.Reason, nt.Token, at.Token+1)
	}
	// The other standby and the old leader keep standing by.
	time.Sleep(time.Second)
	n := 0
	for _, x := range []*candidate{a, b, c} {
		if x.leading() != nil {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d candidates lead; want 1", n)
	}
}

// TestLeaseExpiryAndDeadline: a holder that stops renewing (its renewals
// blocked, as a frozen process's would be) ends its own term before the
// database's expiry, and a standby takes over when the lease lapses.
func TestLeaseExpiryAndDeadline(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	const ttl = 2 * time.Second
	a := startCandidate(t, pg.DSN("outbox"), "a", ttl)
	_, at := waitLeader(t, 5*time.Second, a)
	b := startCandidate(t, pg.DSN("outbox"), "b", ttl)
	time.Sleep(300 * time.Millisecond)

	// Block a's renewals: hold the row lock in another session.
	blocker := pg.Conn(t, "outbox")
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var expires time.Time
	if err := tx.QueryRow(ctx, "SELECT expires_at FROM outbox_lease WHERE slot_name = 's1' FOR UPDATE").Scan(&expires); err != nil {
		t.Fatal(err)
	}
	// a must stop before the database could give the lease away.
	for at.Valid() {
		time.Sleep(2 * time.Millisecond)
	}
	var before bool
	if err := conn.QueryRow(ctx, "SELECT clock_timestamp() < $1", expires).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if !before {
		t.Errorf("a still thought it led when the lease expired in the database")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	_, bt := waitLeader(t, 2*ttl, b)
	t.Logf("b took over: reason %q token %d", bt.Reason, bt.Token)
	if bt.Token <= at.Token {
		t.Errorf("b's token %d is not above a's %d", bt.Token, at.Token)
	}
	// That a state write fenced with a's token is refused now is
	// relay/checkpoint's TestStateWritesFencedByLease.
}

// TestLeaseFrozenHolderSessionEnded: the lease expired while its holder's
// session lives on (a frozen process keeps its TCP connection): the standby
// takes the lease at expiry and terminates that lease session, so that the
// frozen holder finds it gone when it wakes and the advisory lock is freed.
func TestLeaseFrozenHolderSessionEnded(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = AppName
	frozen, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close(ctx)
	if _, err := frozen.Exec(ctx, `INSERT INTO outbox_lease (slot_name, holder, token, holder_pid, expires_at)
		VALUES ('s1', 'frozen', 41, pg_backend_pid(), clock_timestamp() + interval '1500 milliseconds')`); err != nil {
		t.Fatal(err)
	}
	var locked bool
	if err := frozen.QueryRow(ctx, queryTryLock, "s1").Scan(&locked); err != nil || !locked {
		t.Fatalf("frozen holder's advisory lock: %v %v", locked, err)
	}
	start := time.Now()
	b := startCandidate(t, pg.DSN("outbox"), "b", 2*time.Second)
	_, bt := waitLeader(t, 5*time.Second, b)
	took := time.Since(start)
	t.Logf("b took over after %s: reason %q token %d", took.Round(time.Millisecond), bt.Reason, bt.Token)
	if bt.Reason != "expired" || bt.Token != 42 {
		t.Errorf("b's term: reason %q token %d; want expired, 42", bt.Reason, bt.Token)
	}
	if took < time.Second {
		t.Errorf("b took the lease after %s, before it expired", took)
	}
	if err := frozen.Ping(ctx); err == nil {
		t.Errorf("the frozen holder's lease session is still open")
	}
	// b gets the advisory lock once the frozen session is gone.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var held bool
		mon := pg.Conn(t, "outbox")
		if err := mon.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND pid = (SELECT holder_pid FROM outbox_lease WHERE slot_name = 's1'))`).Scan(&held); err != nil {
			t.Fatal(err)
		}
		mon.Close(ctx)
		if held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new leader never took the advisory lock")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
