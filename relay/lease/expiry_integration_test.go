package lease

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// blackhole is a TCP proxy to PostgreSQL that can go silent: from then on
// it keeps every connection open and drops every byte, both ways, and
// passes no close on, as a network path that died without a FIN or an RST.
type blackhole struct {
	ln     net.Listener
	target string
	silent atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
}

func startBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	go b.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			_ = c.Close()
		}
	})
	return b
}

func (b *blackhole) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", b.ln.Addr(), db)
}

func (b *blackhole) silence() { b.silent.Store(true) }

func (b *blackhole) accept() {
	for {
		client, err := b.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, client, server)
		b.mu.Unlock()
		go b.pipe(server, client)
		go b.pipe(client, server)
	}
}

func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !b.silent.Load() {
				_ = dst.Close()
			}
			return
		}
	}
}

// TestLeaseWaitForExpiry: the leader's lease connection dies silently (its
// packets dropped) and the server ends its backend, so that holder_pid is
// gone while the leader, hearing nothing, counts on its own deadline. With
// WaitForExpiry (idempotent mode: no fence at Kafka) a standby takes the
// lease only once it has expired by the database's clock, soon after that,
// and only after the old leader's term ended by its own clock: never two
// valid terms at once. Without it (transactional mode: Kafka fences the old
// producer) the standby takes over at once, before the expiry.
func TestLeaseWaitForExpiry(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait bool
	}{
		{"idempotent", true},
		{"transactional", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			const ttl = 3 * time.Second
			bh := startBlackhole(t, fmt.Sprintf("127.0.0.1:%d", pg.Port))
			a := startCandidateCfg(t, Config{DSN: bh.dsn("outbox"), Slot: "s1", Holder: "a", TTL: ttl, Poll: 200 * time.Millisecond, WaitForExpiry: tc.wait})
			_, at := waitLeader(t, 5*time.Second, a)
			b := startCandidateCfg(t, Config{DSN: pg.DSN("outbox"), Slot: "s1", Holder: "b", TTL: ttl, Poll: 200 * time.Millisecond, WaitForExpiry: tc.wait})
			time.Sleep(500 * time.Millisecond) // b stands by, waiting on the leader's advisory lock

			bh.silence()
			// A renewal that got through before the silence has finished
			// by now: the expiry read next is the last one a set.
			time.Sleep(100 * time.Millisecond)
			var expires time.Time
			var token int64
			var pid int32
			if err := conn.QueryRow(ctx, `SELECT expires_at, token, holder_pid FROM outbox_lease WHERE slot_name = 's1'`).Scan(&expires, &token, &pid); err != nil {
				t.Fatal(err)
			}
			if token != at.Token {
				t.Fatalf("lease token %d; want a's %d", token, at.Token)
			}
			if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				t.Fatal(err)
			}
			cut := time.Now()

			_, bt := waitLeader(t, 2*ttl, b)
			took := time.Since(cut)
			aValid := at.Valid()
			var holder string
			var acquired time.Time
			if err := conn.QueryRow(ctx, `SELECT holder, token, acquired_at FROM outbox_lease WHERE slot_name = 's1'`).Scan(&holder, &token, &acquired); err != nil {
				t.Fatal(err)
			}
			if holder != "b" || token != bt.Token {
				t.Fatalf("lease row: holder %q token %d; want b, %d", holder, token, bt.Token)
			}
			a.mu.Lock()
			aEnded, ended := a.ended[at.Token]
			a.mu.Unlock()
			aTerm := "a's term had not ended when b's began"
			if ended {
				aTerm = fmt.Sprintf("a's term ended %s before b's began", bt.Acquired.Sub(aEnded).Round(time.Millisecond))
			}
			t.Logf("b took over %s after the cut, %s after the lease's expiry by the database's clock (reason %q); %s (a valid when b led: %v)",
				took.Round(time.Millisecond), acquired.Sub(expires).Round(time.Millisecond), bt.Reason, aTerm, aValid)
			if !tc.wait {
				if !acquired.Before(expires) || bt.Reason != "holder session ended" {
					t.Errorf("b took the lease %s after its expiry (reason %q); want at once when the holder's session ended, before the expiry",
						acquired.Sub(expires), bt.Reason)
				}
				return
			}
			if acquired.Before(expires) {
				t.Errorf("b took the lease %s before it expired by the database's clock (reason %q): the old leader may still publish",
					expires.Sub(acquired), bt.Reason)
			}
			if late := acquired.Sub(expires); late > time.Second {
				t.Errorf("b took the lease %s after it expired; want soon after", late)
			}
			if bt.Reason != "expired" {
				t.Errorf("b's term: reason %q; want expired", bt.Reason)
			}
			if !ended || !aEnded.Before(bt.Acquired) || aValid {
				t.Errorf("a's term had not ended when b's began (ended %v, still valid %v): two leaders at once", ended, aValid)
			}
		})
	}
}

// TestLeaseWaitForExpiryRelease: with WaitForExpiry a lease its holder
// released (a graceful stop: the holder stopped publishing first) is still
// taken at once, without waiting for any expiry.
func TestLeaseWaitForExpiryRelease(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	const ttl = 5 * time.Second
	cfg := Config{DSN: pg.DSN("outbox"), Slot: "s1", TTL: ttl, Poll: 200 * time.Millisecond, WaitForExpiry: true}
	cfg.Holder = "a"
	a := startCandidateCfg(t, cfg)
	_, at := waitLeader(t, 5*time.Second, a)
	cfg.Holder = "b"
	b := startCandidateCfg(t, cfg)
	time.Sleep(500 * time.Millisecond)
	released := time.Now()
	a.stop(t)
	_, bt := waitLeader(t, 5*time.Second, b)
	took := time.Since(released)
	t.Logf("b took over %s after a released (reason %s)", took.Round(time.Millisecond), bt.Reason)
	if bt.Reason != "released" || bt.Token != at.Token+1 {
		t.Errorf("b's term: reason %q token %d; want released, %d", bt.Reason, bt.Token, at.Token+1)
	}
	if took > time.Second {
		t.Errorf("b took %s to take a released lease; want at once, not at the expiry (TTL %s)", took, ttl)
	}
}
