package lease

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	schema "github.com/pgoutbox/pgoutbox/sql"

	"github.com/pgoutbox/pgoutbox/internal/pgdurable"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	rfatal "github.com/pgoutbox/pgoutbox/relay/fatal"
)

// AppName is the application_name of lease sessions, so that a new leader
// terminates only a lease session of the previous one.
const AppName = "outbox-connector lease"

// The lease row's expiry is always computed with clock_timestamp(), the
// database's clock when the statement runs (not when its transaction
// started, nor any clock of the hosts).
const (
	// queryTake takes the lease when it may be taken: it lapsed, was
	// released, or, unless $4 (Config.WaitForExpiry), its holder's lease
	// session no longer exists (pid is visible in pg_stat_activity whatever
	// the role). Lapsed and released are decided by the database's clock
	// alone, the clock that set the expiry. The condition is on the row
	// being updated, so a concurrent renewal or takeover is seen (the update
	// re-checks the newest version). Every acquisition gets a new token. One
	// statement: no lock outlives it, whatever happens to this client. old
	// reports the previous holder, for the log and to end its lease session.
	queryTake = `
WITH old AS (
    SELECT holder, coalesce(holder_pid, 0) AS pid,
           holder_pid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = o.holder_pid) AS alive,
           expires_at <= clock_timestamp() AS lapsed
    FROM public.outbox_lease o WHERE slot_name = $1)
UPDATE public.outbox_lease l
SET holder = $2, token = l.token + 1, holder_pid = pg_backend_pid(),
    acquired_at = clock_timestamp(), expires_at = clock_timestamp() + $3 * interval '1 millisecond'
FROM old
WHERE l.slot_name = $1
  AND (l.expires_at <= clock_timestamp() OR l.holder_pid IS NULL
       OR (NOT $4::boolean AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.holder_pid)))
RETURNING l.token, old.holder, old.pid, old.alive, old.lapsed`

	// queryLook reads a lease that could not be taken: who holds it, how
	// long until it lapses by the database's clock, and whether the
	// holder's lease session still exists.
	queryLook = `
SELECT holder, token, greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint,
       holder_pid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = o.holder_pid)
FROM public.outbox_lease o WHERE slot_name = $1`

	queryInsert = `
INSERT INTO public.outbox_lease (slot_name, holder, token, holder_pid, acquired_at, expires_at)
VALUES ($1, $2, 1, pg_backend_pid(), clock_timestamp(), clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (slot_name) DO NOTHING
RETURNING token`

	// queryRenew succeeds only while the token is ours: nobody took over.
	queryRenew = `
UPDATE public.outbox_lease
SET expires_at = clock_timestamp() + $4 * interval '1 millisecond', holder_pid = pg_backend_pid()
WHERE slot_name = $1 AND holder = $2 AND token = $3
RETURNING token`

	queryRelease = `
UPDATE public.outbox_lease SET expires_at = clock_timestamp(), holder_pid = NULL
WHERE slot_name = $1 AND holder = $2 AND token = $3`

	// The advisory lock's key: per slot, within the database.
	lockKey          = `hashtextextended('pgoutbox.lease:' || $1, 0)`
	queryTryLock     = `SELECT pg_try_advisory_lock(` + lockKey + `)`
	queryLock        = `SELECT pg_advisory_lock(` + lockKey + `)`
	queryUnlockAll   = `SELECT pg_advisory_unlock_all()`
	queryLockTimeout = `SELECT set_config('lock_timeout', $1, true)`

	queryTerminate = `
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND application_name = $2`

	queryHasTable = `
SELECT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass('public.outbox_lease') AND attname = 'holder_pid' AND NOT attisdropped)`
)

// leaseDDL is sql/004_connector_state.sql's lease table, for deployments
// that did not apply sql/ and whose role may create it.
var leaseDDL = schema.Statements("public.outbox_lease")

// DefaultHolder names this instance: host, process id and a random suffix,
// unique even for two processes with the same pid in two containers.
func DefaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%x", host, os.Getpid(), b)
}

// session is the elector's own connection ("the lease session"). Its
// backend pid is recorded in the lease row while it leads, and it holds the
// advisory lock then. Only the goroutine running Elector.Run uses it, except
// for interrupt.
type session struct {
	conn     *pgx.Conn
	locked   bool      // holds the advisory lock
	lockedAt time.Time // when a standby was granted it

	// mu guards the read deadline between the elector's goroutine and
	// interrupt: an interrupt must end a wait, never a statement in flight
	// (a renewal cut off by it would end the term as lost, and pgx would
	// close the session, so that the lease could not be released).
	mu          sync.Mutex
	waiting     bool // between arm and the end of wait
	interrupted bool // interrupt was called: every later wait ends at once
}

// arm sets the read deadline of a wait: until, or now once interrupted.
func (s *session) arm(until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = true
	if s.interrupted {
		until = time.Now()
	}
	_ = s.conn.PgConn().Conn().SetReadDeadline(until)
}

func (s *session) disarm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = false
	_ = s.conn.PgConn().Conn().SetReadDeadline(time.Time{})
}

// rearm forgets an earlier interrupt, at the start of a term.
func (s *session) rearm() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.interrupted = false
}

// interrupt ends a wait at once, and makes the next wait end at once; a
// statement in flight runs to its end. Safe from any goroutine.
func (s *session) interrupt() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.interrupted = true
	if s.waiting {
		_ = s.conn.PgConn().Conn().SetReadDeadline(time.Now())
	}
}

// wait reads the idle session until the armed deadline. An idle session
// receives nothing, unless the server ends it: a terminated backend sends a
// FATAL error and closes the socket, and a dead server closes it. Either
// returns an error at once.
func (s *session) wait() error {
	err := s.conn.PgConn().WaitForNotification(context.Background())
	if s.conn.IsClosed() {
		if err == nil {
			err = errors.New("connection closed")
		}
		return err
	}
	s.disarm()
	if err == nil || isTimeout(err) {
		return nil
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || pgconn.Timeout(err)
}

// retryable reports a statement error after which the session is still
// usable: the server answered with an ERROR (not FATAL) and the connection
// is open.
func (e *Elector) retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Severity == "ERROR" && e.sess != nil && !e.sess.conn.IsClosed()
}

// fatal reports errors a retry cannot fix: authentication and authorization
// (SQLSTATE class 28, 42501), a missing database (3D000), a missing lease
// table (42P01, after connect tried to create it).
func fatal(err error) bool {
	// The connector's own policy (authentication, privilege, a missing
	// database, a certificate a TLS handshake failed on: an expired client
	// certificate was retried here for ever, the standby never saying more
	// than unready), and a missing lease table.
	var pgErr *pgconn.PgError
	return rfatal.Is(err) || errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// connect opens the lease session unless it is open.
func (e *Elector) connect(ctx context.Context) error {
	if e.sess != nil && !e.sess.conn.IsClosed() {
		return nil
	}
	e.closeSession()
	cfg, err := pgx.ParseConfig(e.cfg.DSN)
	if err != nil {
		return fmt.Errorf("parse the connection string for the lease session: %w", err)
	}
	cfg.RuntimeParams["application_name"] = AppName
	cctx, cancel := context.WithTimeout(ctx, max(e.cfg.TTL/2, time.Second))
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return fmt.Errorf("open the lease session: %w", err)
	}
	// The lease's renewals and releases are what a standby decides by:
	// durable.
	if err := pgdurable.Ensure(cctx, conn); err != nil {
		conn.Close(context.Background())
		return fmt.Errorf("open the lease session: %w", err)
	}
	if err := ensureTable(cctx, conn); err != nil {
		conn.Close(context.Background())
		return err
	}
	e.sess = &session{conn: conn}
	return nil
}

func ensureTable(ctx context.Context, conn *pgx.Conn) error {
	var ok bool
	if err := conn.QueryRow(ctx, queryHasTable).Scan(&ok); err != nil {
		return fmt.Errorf("look up public.outbox_lease: %w", err)
	}
	if ok {
		return nil
	}
	for _, q := range leaseDDL {
		if _, err := conn.Exec(ctx, q); err != nil {
			return &pgconn.PgError{Severity: "FATAL", Code: "42P01",
				Message: "the lease table public.outbox_lease is missing (or lacks column holder_pid) and this role cannot create it; apply sql/004_connector_state.sql: " + err.Error()}
		}
	}
	return nil
}

func (e *Elector) closeSession() {
	if e.sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = e.sess.conn.Close(ctx)
	e.sess = nil
}

// sight is what a standby saw of the lease.
type sight struct {
	acquired  bool
	token     int64
	holder    string // the holder before an acquisition, or the current one
	pid       int32  // that holder's lease session
	alive     bool   // that session still exists
	reason    string
	remaining time.Duration // until the lease lapses (by the database's clock)
}

// tryAcquire takes the lease if it may be taken. Each statement stands
// alone: a standby frozen between two of them holds no lock that would
// block the leader's renewals or another standby.
func (e *Elector) tryAcquire(ctx context.Context) (sight, error) {
	var s sight
	ttl := e.cfg.TTL.Milliseconds()
	conn := e.sess.conn
	var lapsed bool
	err := conn.QueryRow(ctx, queryTake, e.cfg.Slot, e.cfg.Holder, ttl, e.cfg.WaitForExpiry).Scan(&s.token, &s.holder, &s.pid, &s.alive, &lapsed)
	switch {
	case err == nil:
		switch {
		case s.pid == 0:
			s.reason = "released"
		case !s.alive && !lapsed:
			s.reason = "holder session ended"
		default:
			s.reason = "expired"
		}
		s.acquired = true
		return s, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return s, fmt.Errorf("take the leader lease: %w", err)
	}
	var remaining int64
	err = conn.QueryRow(ctx, queryLook, e.cfg.Slot).Scan(&s.holder, &s.token, &remaining, &s.alive)
	switch {
	case err == nil:
		s.remaining = time.Duration(remaining) * time.Millisecond
		return s, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return s, fmt.Errorf("look at the leader lease: %w", err)
	}
	err = conn.QueryRow(ctx, queryInsert, e.cfg.Slot, e.cfg.Holder, ttl).Scan(&s.token)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return s, nil // another instance inserted it first: look again
	case err != nil:
		return s, fmt.Errorf("create the leader lease: %w", err)
	}
	s.acquired, s.reason, s.holder = true, "free", ""
	return s, nil
}

// acquire waits as a standby until this instance holds the lease. It
// returns nil, nil when ctx ends.
func (e *Elector) acquire(ctx context.Context) (*Term, error) {
	backoff := retry.New(100*time.Millisecond, max(e.cfg.Poll, 5*time.Second))
	var seen string
	for {
		if ctx.Err() != nil {
			return nil, nil
		}
		err := e.connect(ctx)
		var s sight
		sent := time.Now()
		if err == nil {
			s, err = e.tryAcquire(ctx)
		}
		e.contact(err)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			if fatal(err) {
				return nil, fmt.Errorf("leader lease for slot %q: %w", e.cfg.Slot, err)
			}
			e.closeSession()
			wait := backoff.NextBackOff()
			e.cfg.Log.Warn("cannot reach the leader lease; retrying", "slot", e.cfg.Slot, "err", err, "backoff", wait)
			sleep(ctx, wait)
			continue
		}
		backoff.Reset()
		if s.acquired {
			t := newTerm(e.cfg.Slot, s.token, sent, e.cfg.TTL)
			t.Previous, t.Reason = s.holder, s.reason
			e.afterAcquire(ctx, s)
			e.current.Store(t)
			e.cfg.Log.Info("acquired the leader lease", "slot", e.cfg.Slot, "token", t.Token, "holder", e.cfg.Holder,
				"previous", s.holder, "reason", s.reason)
			if e.cfg.OnAcquire != nil {
				e.cfg.OnAcquire(t)
			}
			return t, nil
		}
		if now := s.holder + "/" + strconv.FormatInt(s.token, 10); now != seen && s.holder != "" {
			seen = now
			e.cfg.Log.Info("standing by", "slot", e.cfg.Slot, "leader", s.holder, "token", s.token, "expires_in", s.remaining)
		}
		e.waitHolder(ctx, s)
	}
}

// afterAcquire ends the lease session of a previous holder that is still
// connected (frozen, or cut off from us but not from the server): it holds
// the advisory lock, and when it wakes it must find its session gone. Then
// it takes the advisory lock, if it can.
func (e *Elector) afterAcquire(ctx context.Context, s sight) {
	if s.alive && s.pid != 0 {
		var ok bool
		err := e.sess.conn.QueryRow(ctx, queryTerminate, s.pid, AppName).Scan(&ok)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			// A role may end its own sessions; another role's need
			// pg_signal_backend. Without it the old holder keeps the advisory
			// lock until it exits, and standbys fall back to polling.
			e.cfg.Log.Warn("could not end the previous leader's lease session (run every instance as the same role, or GRANT pg_signal_backend)",
				"slot", e.cfg.Slot, "pid", s.pid, "err", err)
		default:
			e.cfg.Log.Info("ended the previous leader's lease session", "slot", e.cfg.Slot, "pid", s.pid, "previous", s.holder)
		}
	}
	e.tryLock(ctx)
}

func (e *Elector) tryLock(ctx context.Context) {
	if e.sess == nil || e.sess.locked {
		return
	}
	var ok bool
	if err := e.sess.conn.QueryRow(ctx, queryTryLock, e.cfg.Slot).Scan(&ok); err == nil && ok {
		e.sess.locked = true
	}
}

// waitHolder waits until the lease may have become free: the advisory lock
// (held by the leader's session) is granted the moment that session ends;
// otherwise the wait ends when the lease lapses, or after Poll.
func (e *Elector) waitHolder(ctx context.Context, s sight) {
	wait := min(max(s.remaining+10*time.Millisecond, 10*time.Millisecond), e.cfg.Poll)
	if e.sess.locked && e.cfg.WaitForExpiry && !s.alive {
		// The holder's session is gone but its lease runs until it lapses
		// by the database's clock: nothing before that frees it but a
		// release, which would need a live holder. Keep the lock (no other
		// session wants it) and look again at the expiry.
		sleep(ctx, wait)
		return
	}
	if e.sess.locked {
		// We hold the lock yet could not take the lease. A backend that
		// exits releases its locks a moment before it leaves
		// pg_stat_activity: look again shortly.
		if time.Since(e.sess.lockedAt) < 500*time.Millisecond {
			sleep(ctx, min(wait, 10*time.Millisecond))
			return
		}
		// Its holder lives without the lock (it took over from a holder
		// that kept it). Let it take the lock, and look again later.
		if _, err := e.sess.conn.Exec(ctx, queryUnlockAll); err != nil {
			e.closeSession()
		} else {
			e.sess.locked = false
		}
		sleep(ctx, wait)
		return
	}
	got, err := e.lockWait(ctx, wait)
	if err != nil {
		e.closeSession()
		return
	}
	if got {
		e.sess.locked = true
		e.sess.lockedAt = time.Now()
	}
}

// lockWait blocks on the advisory lock for up to d.
func (e *Elector) lockWait(ctx context.Context, d time.Duration) (bool, error) {
	tx, err := e.sess.conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, queryLockTimeout, strconv.FormatInt(max(d.Milliseconds(), 1), 10)); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, queryLock, e.cfg.Slot); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
			return false, nil
		}
		return false, err
	}
	return true, tx.Commit(ctx)
}

// renew extends the lease by a TTL from now (the database's now), within
// the term's deadline.
func (e *Elector) renew(t *Term) error {
	ctx, cancel := context.WithDeadline(context.Background(), t.Deadline())
	defer cancel()
	var token int64
	err := e.sess.conn.QueryRow(ctx, queryRenew, e.cfg.Slot, e.cfg.Holder, t.Token, e.cfg.TTL.Milliseconds()).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: another instance took the lease (token %d is no longer current)", ErrLost, t.Token)
	}
	if err != nil {
		return fmt.Errorf("renew the leader lease: %w", err)
	}
	e.tryLock(ctx)
	return nil
}

// release gives the lease up: the term ends first (this instance stops
// reporting itself leader), then the row lapses and the advisory lock is
// freed, which wakes the standbys.
func (e *Elector) release(t *Term) {
	t.end(errReleased)
	if e.sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(RenewEvery(e.cfg.TTL), 2*time.Second))
	defer cancel()
	if _, err := e.sess.conn.Exec(ctx, queryRelease, e.cfg.Slot, e.cfg.Holder, t.Token); err != nil {
		e.cfg.Log.Warn("releasing the leader lease failed; it lapses by itself", "slot", e.cfg.Slot, "token", t.Token, "err", err)
		e.closeSession()
		return
	}
	if _, err := e.sess.conn.Exec(ctx, queryUnlockAll); err != nil {
		e.closeSession()
	} else {
		e.sess.locked = false
	}
	e.cfg.Log.Info("released the leader lease", "slot", e.cfg.Slot, "token", t.Token)
}
