package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// The fault test's members run in child processes (so that a kill is a
// SIGKILL, with the transaction in flight); this is their environment.
const (
	envMemberDSN     = "INBOX_TEST_MEMBER_DSN"
	envMemberBrokers = "INBOX_TEST_MEMBER_BROKERS"
	envMemberTopic   = "INBOX_TEST_MEMBER_TOPIC"
	envMemberDLQ     = "INBOX_TEST_MEMBER_DLQ"
	envMemberGroup   = "INBOX_TEST_MEMBER_GROUP"
)

// The fault test's settings, shared by the test and its members.
const (
	faultEvents      = 10000
	faultPartitions  = 6
	faultAggregates  = 300
	faultMaxAttempts = 3
	faultBackoff     = 10 * time.Millisecond
	faultTxTimeout   = 2 * time.Second
	faultSession     = 6 * time.Second // the broker's group.min.session.timeout.ms
	faultMaxBackoff  = 5 * time.Second // the inbox's cap
	faultKills       = 3
	// Each event's handler works this long (a call to another service), so
	// that the work outlasts the three faults (the last at about 26 s):
	// 10,000 events over 6 partitions take 20 s of handler time per
	// partition, and each fault stalls some for 6 s or more.
	faultWork = 12 * time.Millisecond
	// After a member's death is noticed the group rebalances (cooperative:
	// two rounds, the second for what moved), and the new owner fetches.
	// A rebalance waits for the attempts in flight of the partitions that
	// move, not for queued records (each partition has a worker): measured
	// alone, a stall after a SIGKILL was the session timeout and 0.1 s.
	// The allowance is for a loaded machine (make test runs packages side
	// by side): it is what the bound must not be, a wedge (a handler hung
	// past TxTimeout, a retry without its cap) or a partition waiting for
	// another (a member working poll by poll: 11.4 s, see
	// TestPartitionsDoNotWaitForEachOther); the stalls are logged.
	faultRebalance = 3 * time.Second
	// How long the third fault freezes a member: past the session timeout,
	// so that the group moves its partitions while it holds a transaction.
	// Its locks hold the new owner's inserts of the same ids until it thaws
	// and rolls back (lock_timeout, retried with backoff): that partition's
	// stall is the freeze plus a backoff step.
	faultFreeze = faultSession + time.Second
	// One kill at a time, each after the group settled from the last, so
	// that each stall has one cause: a dead member is noticed after the
	// session timeout, then the group rebalances.
	faultKillInterval = faultSession + 4*time.Second
)

// fate is what the fault test's handler does with an event, decided by its
// id so that every member (and the test) agrees.
type fate string

const (
	fateOK        fate = "ok"
	fateFail      fate = "fail"       // returns a business error every time: dead letter
	fatePanic     fate = "panic"      // panics every time: dead letter
	fateSwallow   fate = "swallow"    // swallows a failed statement (COMMIT answers ROLLBACK): dead letter
	fateData      fate = "data"       // returns a 22P02 invalid input error: dead letter
	fateTransient fate = "transient"  // raises a transient SQLSTATE on its first 1..5 attempts: applied
	fatePanicOnce fate = "panic-once" // panics on its first attempt: applied
	fateFailOnce  fate = "fail-once"  // fails on its first attempt: applied
)

func fateOf(id string) (fate, int) {
	h := fnv.New32a()
	h.Write([]byte(id))
	v := int(h.Sum32() % 1000)
	switch {
	case v < 8:
		return fateFail, 0
	case v < 14:
		return fatePanic, 0
	case v < 20:
		return fateSwallow, 0
	case v < 26:
		return fateData, 0
	case v < 46:
		return fateTransient, 1 + v%5 // up to 5 failures: more than MaxAttempts
	case v < 54:
		return fatePanicOnce, 0
	case v < 60:
		return fateFailOnce, 0
	}
	return fateOK, 0
}

func (f fate) recordFault() bool {
	switch f {
	case fateFail, fatePanic, fateSwallow, fateData:
		return true
	}
	return false
}

// reasonOf is what the dead letter's inbox.error must contain.
func (f fate) reason() string {
	switch f {
	case fateFail:
		return "the business refuses"
	case fatePanic:
		return "handler panicked"
	case fateSwallow:
		return "commit unexpectedly resulted in rollback"
	case fateData:
		return "22P02"
	}
	return ""
}

var transientStates = []string{"40001", "40P01", "55P03", "57014", "53300", "08006"}

// faultHandler counts each attempt in a table outside the inbox's
// transaction (it survives rollbacks and kills), then does what the event's
// fate says; applying an event inserts a row into effects, which has no
// unique constraint: a second application would be a second row.
func faultHandler(pool *pgxpool.Pool) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		id := inbox.Header(r, "id")
		var n int
		if err := pool.QueryRow(ctx, `INSERT INTO attempts AS a (id, n) VALUES ($1, 1)
			ON CONFLICT (id) DO UPDATE SET n = a.n + 1 RETURNING n`, id).Scan(&n); err != nil {
			return fmt.Errorf("count the attempt: %w", err) // a transient SQLSTATE if the database is the cause
		}
		select {
		case <-ctx.Done():
		case <-time.After(faultWork):
		}
		f, k := fateOf(id)
		switch {
		case f == fateFail || (f == fateFailOnce && n == 1):
			return errors.New("the business refuses this event")
		case f == fatePanic || (f == fatePanicOnce && n == 1):
			panic("the handler's bug")
		case f == fateSwallow:
			_, _ = tx.Exec(ctx, `SELECT 1/0`)
			return nil
		case f == fateData:
			_, err := tx.Exec(ctx, `SELECT 'not a number'::int`)
			return err
		case f == fateTransient && n <= k:
			state := transientStates[n%len(transientStates)]
			_, err := tx.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION 'transient (raised by the test)' USING ERRCODE = '%s'; END $$`, state))
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, kafka_partition, applied_at) VALUES ($1, $2, clock_timestamp())`, id, r.Partition)
		return err
	}
}

// TestFaultMember is not a test of its own: TestInboxGroupUnderFaults runs
// the test binary again with it alone, as one member of the group, until
// it is killed (SIGKILL) or stopped (SIGTERM).
func TestFaultMember(t *testing.T) {
	dsn := os.Getenv(envMemberDSN)
	if dsn == "" {
		t.Skip("runs only as a child process of TestInboxGroupUnderFaults")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := inbox.New(pool, faultHandler(pool), inbox.Config{
		Brokers: []string{os.Getenv(envMemberBrokers)}, Group: os.Getenv(envMemberGroup), Topics: []string{os.Getenv(envMemberTopic)},
		DLQTopic: os.Getenv(envMemberDLQ), MaxAttempts: faultMaxAttempts, RetryBackoff: faultBackoff,
		TxTimeout: faultTxTimeout, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		KafkaOpts: []kgo.Opt{kgo.SessionTimeout(faultSession), kgo.HeartbeatInterval(500 * time.Millisecond)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// member is one child process of the group.
type member struct {
	cmd  *exec.Cmd
	done chan error
}

func startMember(env []string) (*member, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestFaultMember$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a member: %w", err)
	}
	m := &member{cmd: cmd, done: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		if err != nil && !strings.Contains(err.Error(), "signal: killed") {
			err = fmt.Errorf("%w:\n%s", err, out.String())
		}
		m.done <- err
	}()
	return m, nil
}

// TestInboxGroupUnderFaults (issue 14 acceptance): a group of 3 inbox
// members, each a child process, consumes 10,000 events of 300 aggregates
// over 6 partitions while its handler returns transient database errors
// (more of them per event than MaxAttempts), record errors (a business
// error, a data error, a swallowed failed statement) and panics, and while
// members are killed with SIGKILL or stopped with SIGTERM and replaced, or
// frozen (SIGSTOP) past the session timeout and thawed, each a rebalance.
// Afterwards:
//
//   - every event whose handler can succeed is applied exactly once (effects,
//     without a unique constraint, holds one row per such id);
//   - every record-fault event is in the DLQ whole (key, value, id) with its
//     reason, none is applied, and no other event is in the DLQ;
//   - no partition went longer without progress than a member's death takes
//     to notice (the session timeout) and the group to rebalance
//     (faultRebalance) plus TxTimeout plus the backoff cap, from the start
//     of the members (the events are all there by then), with the inbox's
//     defaults for fetching and polling.
func TestInboxGroupUnderFaults(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `DROP TABLE effects;
		CREATE TABLE effects (event_id text NOT NULL, kafka_partition int NOT NULL, applied_at timestamptz NOT NULL);
		CREATE TABLE attempts (id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	topic := e.topic + ".faults"
	adm := kadm.NewClient(e.prod)
	if _, err := adm.CreateTopics(ctx, faultPartitions, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	// All events at once: every partition has a backlog until it is done,
	// so a gap between two completions in a partition is a stall.
	want := map[string]fate{}
	values := map[string]string{}
	var recs []*kgo.Record
	for i := 0; i < faultEvents; i++ {
		id := fmt.Sprintf("ev-%05d", i)
		f, _ := fateOf(id)
		want[id] = f
		values[id] = fmt.Sprintf(`{"n":%d,"fate":%q}`, i, f)
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("agg-%03d", i%faultAggregates)),
			Value: []byte(values[id]), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}}})
	}
	applicable, faults := 0, 0
	for _, f := range want {
		if f.recordFault() {
			faults++
		} else {
			applicable++
		}
	}
	env := []string{envMemberDSN + "=" + e.pool.Config().ConnString(), envMemberBrokers + "=" + e.brokers,
		envMemberTopic + "=" + topic, envMemberDLQ + "=" + e.dlq, envMemberGroup + "=g-" + topic}

	// The events go in first, then the members start, one process each:
	// the stalls are measured from then, so the group's forming counts too
	// (three joins, each a cooperative rebalance moving partitions from the
	// members already working on them).
	if err := e.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var mu sync.Mutex
	var members []*member
	for range 3 {
		m, err := startMember(env)
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range members {
			_ = m.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, m := range members {
			select {
			case err := <-m.done:
				if err != nil {
					t.Errorf("member: %v", err)
				}
			case <-time.After(30 * time.Second):
				_ = m.cmd.Process.Kill()
				t.Errorf("a member did not stop within 30s of SIGTERM")
			}
		}
	}()
	applied := func() (distinct, rows int) {
		if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT event_id), count(*) FROM effects`).Scan(&distinct, &rows); err != nil {
			t.Fatal(err)
		}
		return distinct, rows
	}
	deadLettered := func() int {
		return count(t, e.pool, `SELECT count(*) FROM inbox WHERE outcome = 'dead-lettered'`)
	}
	// Kill or stop one member at a time and replace it, while work remains.
	kills := 0
	var killLog []string
	killsDone := make(chan struct{})
	go func() {
		defer close(killsDone)
		for kills < faultKills {
			// The first once the group has settled from its start.
			time.Sleep(map[bool]time.Duration{true: faultKillInterval / 2, false: faultKillInterval}[kills == 0])
			var d int
			if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM effects`).Scan(&d); err != nil || d >= applicable {
				return
			}
			mu.Lock()
			i := rand.IntN(len(members))
			m := members[i]
			at := time.Since(start).Round(100 * time.Millisecond)
			if kills%3 == 2 {
				// Frozen past the session timeout (a GC pause, a stalled
				// VM): the group loses it and moves its partitions while
				// its transaction in flight still holds its locks; thawed,
				// it finds its partitions lost (OnPartitionsLost) and joins
				// again. Not replaced.
				killLog = append(killLog, fmt.Sprintf("%s SIGSTOP for %s", at, faultFreeze))
				_ = m.cmd.Process.Signal(syscall.SIGSTOP)
				time.Sleep(faultFreeze)
				_ = m.cmd.Process.Signal(syscall.SIGCONT)
				kills++
				mu.Unlock()
				continue
			}
			sig := syscall.SIGKILL
			if kills%3 == 1 {
				sig = syscall.SIGTERM
			}
			killLog = append(killLog, fmt.Sprintf("%s %s", at, map[syscall.Signal]string{syscall.SIGKILL: "SIGKILL", syscall.SIGTERM: "SIGTERM"}[sig]))
			_ = m.cmd.Process.Signal(sig)
			if err := <-m.done; err != nil && sig == syscall.SIGTERM {
				t.Errorf("member stopped with SIGTERM: %v", err)
			}
			next, err := startMember(env)
			if err != nil {
				t.Error(err)
				mu.Unlock()
				return
			}
			members[i] = next
			kills++
			mu.Unlock()
		}
	}()
	deadline := time.Now().Add(150 * time.Second)
	for {
		d, _ := applied()
		if d >= applicable && deadLettered() >= faults {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %d of %d applicable events applied, %d of %d record faults dead-lettered",
				time.Since(start).Round(time.Second), d, applicable, deadLettered(), faults)
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	<-killsDone
	if kills < faultKills {
		t.Errorf("only %d member kills/stops/freezes happened before the work was done; the test wants %d (one of each)", kills, faultKills)
	}

	// Exactly once, and only what can be applied.
	rows, err := e.pool.Query(ctx, `SELECT event_id, count(*) FROM effects GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	times := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		times[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var twice, faultApplied, missing []string
	for id, f := range want {
		switch n := times[id]; {
		case f.recordFault() && n > 0:
			faultApplied = append(faultApplied, id)
		case !f.recordFault() && n > 1:
			twice = append(twice, fmt.Sprintf("%s(%s)x%d", id, f, n))
		case !f.recordFault() && n == 0:
			missing = append(missing, id)
		}
	}
	for _, l := range []struct {
		what string
		ids  []string
	}{{"applied more than once", twice}, {"record faults applied", faultApplied}, {"never applied", missing}} {
		if len(l.ids) > 0 {
			sort.Strings(l.ids)
			t.Errorf("%d events %s: %v", len(l.ids), l.what, l.ids[:min(len(l.ids), 10)])
		}
	}

	// The DLQ: every record fault, whole, with its reason; nothing else.
	dlq := e.dlqReader(t)
	var dead map[string]*kgo.Record
	waitFor(t, "every record fault in the DLQ", 30*time.Second, func() bool {
		dead = byID(dlq.read())
		return len(dead) >= faults
	})
	var innocent, wrong []string
	for id, r := range dead {
		f := want[id]
		if !f.recordFault() {
			innocent = append(innocent, fmt.Sprintf("%s(%s): %s", id, f, inbox.Header(r, "inbox.error")))
			continue
		}
		if string(r.Value) != values[id] || !strings.HasPrefix(string(r.Key), "agg-") ||
			!strings.Contains(inbox.Header(r, "inbox.error"), f.reason()) {
			wrong = append(wrong, fmt.Sprintf("%s(%s): value %q reason %q", id, f, r.Value, inbox.Header(r, "inbox.error")))
		}
	}
	if len(innocent) > 0 {
		t.Errorf("%d innocent events dead-lettered: %v", len(innocent), innocent[:min(len(innocent), 10)])
	}
	if len(wrong) > 0 {
		t.Errorf("%d dead letters not whole or without their reason: %v", len(wrong), wrong[:min(len(wrong), 10)])
	}

	// Stalls: the longest time a partition went without completing an event
	// (applied or dead-lettered) while it still had a backlog, the members'
	// start counting as each partition's first completion.
	stallRows, err := e.pool.Query(ctx, `
		SELECT DISTINCT ON (kafka_partition) kafka_partition, extract(epoch FROM gap)::float8,
			extract(epoch FROM at - gap - $1::timestamptz)::float8 FROM (
			SELECT kafka_partition, at, at - lag(at) OVER (PARTITION BY kafka_partition ORDER BY at) AS gap FROM (
				SELECT kafka_partition, applied_at AS at FROM effects
				UNION ALL SELECT kafka_partition, processed_at FROM inbox WHERE outcome = 'dead-lettered'
				UNION ALL SELECT p, $1::timestamptz FROM generate_series(0, $2 - 1) p) c) g
		WHERE gap IS NOT NULL ORDER BY kafka_partition, gap DESC`, start, faultPartitions)
	if err != nil {
		t.Fatal(err)
	}
	bound := faultSession + faultRebalance + faultTxTimeout + faultMaxBackoff
	var worst time.Duration
	var stalls []string
	for stallRows.Next() {
		var p int
		var seconds, from float64
		if err := stallRows.Scan(&p, &seconds, &from); err != nil {
			t.Fatal(err)
		}
		gap := time.Duration(seconds * float64(time.Second))
		worst = max(worst, gap)
		stalls = append(stalls, fmt.Sprintf("p%d %s from %.1fs", p, gap.Round(10*time.Millisecond), from))
	}
	if err := stallRows.Err(); err != nil {
		t.Fatal(err)
	}
	if worst > bound {
		t.Errorf("a partition stalled %s, more than session timeout + rebalance + TxTimeout + backoff cap (%s): %v; kills at %v", worst, bound, stalls, killLog)
	}
	var attempts, transientAttempts int
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM attempts`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	for id, f := range want {
		if f == fateTransient {
			_, k := fateOf(id)
			transientAttempts += k
		}
	}
	_, effectRows := applied()
	t.Logf("%d events (%d applicable, %d record faults) in %s with %d member kills/stops; %d effect rows; %d handler attempts "+
		"(%d transient failures by design); %d dead letters in the DLQ topic; longest stall per partition: %v (bound %s); kills at %v",
		faultEvents, applicable, faults, took.Round(100*time.Millisecond), kills, effectRows, attempts, transientAttempts,
		len(dlq.read()), stalls, bound, killLog)
}
