package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/route"
)

// injector fails, or kills the process at, the n-th time a session reaches
// one step.
type injector struct {
	step  fault.Step
	n     int
	kill  bool
	mu    sync.Mutex
	seen  int
	fired chan struct{}
	// streaming, when set, tells whether the relay streams the slot (the
	// snapshot is done); streamed records its answer when the fault fired.
	streaming func() bool
	streamed  atomic.Bool
}

var errInjected = errors.New("injected by the test")

func newInjector(step fault.Step, n int, kill bool) *injector {
	return &injector{step: step, n: n, kill: kill, fired: make(chan struct{})}
}

func (in *injector) hook(s fault.Step) error {
	if s != in.step {
		return nil
	}
	in.mu.Lock()
	in.seen++
	hit := in.seen == in.n
	streaming := in.streaming
	in.mu.Unlock()
	if !hit {
		return nil
	}
	if streaming != nil {
		in.streamed.Store(streaming())
	}
	if in.kill {
		// As kill -9 would: no deferred function, no graceful stop, no
		// last status update.
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	close(in.fired)
	return errInjected
}

// Environment of the child process that TestStepKillChild runs in.
const (
	envKillDSN     = "OUTBOX_TEST_KILL_DSN"
	envKillBrokers = "OUTBOX_TEST_KILL_BROKERS"
	envKillStep    = "OUTBOX_TEST_KILL_STEP"
	envKillN       = "OUTBOX_TEST_KILL_N"
)

// TestStepKillChild is not a test of its own: the step tests run the test
// binary again with it alone, as a connector that kills itself with SIGKILL
// at a named step.
func TestStepKillChild(t *testing.T) {
	dsn := os.Getenv(envKillDSN)
	if dsn == "" {
		t.Skip("runs only as the child process of the step tests")
	}
	n, _ := strconv.Atoi(os.Getenv(envKillN))
	in := newInjector(fault.Step(os.Getenv(envKillStep)), n, true)
	run := startRelayFaults(t, testConfig(t, dsn, os.Getenv(envKillBrokers)), route.DefaultConfig(), in.hook)
	select {
	case err := <-run.done:
		t.Fatalf("relay ended before step %s was reached %d times: %v", in.step, n, err)
	case <-time.After(90 * time.Second):
		t.Fatalf("step %s was not reached %d times within 90 s", in.step, n)
	}
}

// startKillChild runs a connector in a child process that dies with SIGKILL
// the n-th time it reaches step; it returns once the child is dead.
func startKillChild(t *testing.T, dsn, brokers string, step fault.Step, n int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStepKillChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envKillDSN+"="+dsn, envKillBrokers+"="+brokers, envKillStep+"="+string(step), envKillN+"="+strconv.Itoa(n))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child connector did not die at step %s (%v):\n%s", step, err, out)
	}
}

// rollbacks writes outbox events in transactions that roll back, until
// stopped, and remembers their ids: none may ever reach Kafka.
type rollbacks struct {
	mu   sync.Mutex
	ids  []string
	stop chan struct{}
	done chan struct{}
}

func startRollbacks(t *testing.T, dsn, aggType string) *rollbacks {
	t.Helper()
	rb := &rollbacks{stop: make(chan struct{}), done: make(chan struct{})}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(rb.done)
		defer conn.Close(ctx)
		for {
			select {
			case <-rb.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			id := uuid.NewString()
			tx, err := conn.Begin(ctx)
			if err != nil {
				return
			}
			_, err = tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'agg-0', 'RolledBack', '{}')`, id, aggType)
			_ = tx.Rollback(ctx)
			if err != nil {
				return
			}
			rb.mu.Lock()
			rb.ids = append(rb.ids, id)
			rb.mu.Unlock()
		}
	}()
	t.Cleanup(rb.halt)
	return rb
}

func (rb *rollbacks) halt() {
	select {
	case <-rb.stop:
	default:
		close(rb.stop)
	}
	<-rb.done
}

// check fails the test if any rolled-back event was published.
func (rb *rollbacks) check(t *testing.T, c *testenv.Consumer) {
	t.Helper()
	rb.halt()
	rb.mu.Lock()
	defer rb.mu.Unlock()
	ids := make(map[string]bool, len(rb.ids))
	for _, id := range rb.ids {
		ids[id] = true
	}
	for _, r := range c.Records() {
		if id := testenv.Header(r, "id"); ids[id] {
			t.Errorf("event %s of a transaction that rolled back was published", id)
		}
	}
	if len(rb.ids) == 0 {
		t.Error("no rolled-back transaction was written: the check proves nothing")
	}
}

// stepCase is one fault: at the n-th time a session reaches step, the step
// fails (kill false) or the process dies (kill true).
type stepCase struct {
	step fault.Step
	n    int
	kill bool
}

func (c stepCase) String() string {
	mode := "error"
	if c.kill {
		mode = "kill"
	}
	return fmt.Sprintf("%s-%d-%s", c.step, c.n, mode)
}

// runStepCase checks the invariants across one fault, on a new cluster:
// events written before the connector's first start (the initial snapshot
// owes them), events written under load all along, and transactions that
// roll back. Afterwards: every committed event is in Kafka (nothing lost,
// so nothing was confirmed that was not acked), per aggregate in commit
// order, and nothing of a rolled-back transaction was published.
func runStepCase(t *testing.T, sc stepCase) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	dsn := pg.DSN("outbox")
	aggType := uniqueType("step")
	conn := pg.Conn(t, "outbox")
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 200, 10, 20)
	// The load has its own aggregates: each writer numbers its own.
	loadType := aggType + "l"
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType, "outbox.event."+loadType)
	lw := testenv.StartLoad(t, dsn, loadType, 10, 5*time.Millisecond)
	rb := startRollbacks(t, dsn, loadType)

	cfg := testConfig(t, dsn, brokers)
	var run *running
	streamedAtFault := false
	if sc.kill {
		startKillChild(t, dsn, brokers, sc.step, sc.n)
		run = startRelay(t, cfg)
	} else {
		in := newInjector(sc.step, sc.n, false)
		run = startRelayFaults(t, cfg, route.DefaultConfig(), in.hook)
		in.mu.Lock()
		in.streaming = run.relay.Streaming
		in.mu.Unlock()
		select {
		case <-in.fired:
			streamedAtFault = in.streamed.Load()
		case err := <-run.done:
			t.Fatalf("relay ended before the fault: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatalf("step %s was not reached %d times within 60 s", sc.step, sc.n)
		}
	}
	run.waitStreaming(t)
	time.Sleep(time.Second)
	want := append(w.Snapshot(), lw.Halt()...)
	c.WaitFor(t, want, 90*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, want)
	rb.check(t, c)
	if t.Failed() {
		return
	}
	t.Logf("%s: %d events (200 before the first start), all delivered in order, %d duplicates, no rolled-back event published", sc, len(want), dups)
	// Exactly-once: a fault once the snapshot is done (the state writer's
	// and the status steps come only then) repeats nothing. One during the
	// snapshot takes it again, at-least-once: its rows, and the rows
	// committed between the lost snapshot and the slot's position, are
	// published again (the figure above measures it).
	late := sc.step == fault.BeforePromise || sc.step == fault.AfterPromise || sc.step == fault.BeforeStatus || sc.step == fault.AfterStatus
	if (late || streamedAtFault) && dups != 0 {
		t.Errorf("%s: %d duplicates after a fault while streaming; want 0 (exactly-once)", sc, dups)
	}
	if !late && !streamedAtFault {
		t.Logf("%s: the fault may have hit the initial snapshot (at-least-once): %d duplicates", sc, dups)
	}
}

// startSteps are reached once, at the first start of a connector whose
// slot does not exist yet.
var startSteps = []fault.Step{fault.SlotIntent, fault.SlotCreated, fault.SnapshotImported, fault.StateWritten, fault.SnapshotDone}

// TestStepFaults: the connector fails, or is killed, at every named step of
// a session; the next session loses nothing. `make test` runs each step
// once, in a mode and at an occurrence drawn at random (logged; set
// OUTBOX_TEST_SEED to repeat a draw); `make soak` runs every step in both
// modes at several occurrences, soakRounds times over.
func TestStepFaults(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("OUTBOX_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	var cases []stepCase
	for _, step := range fault.Steps {
		once := false
		for _, s := range startSteps {
			once = once || s == step
		}
		if os.Getenv("OUTBOX_SOAK") != "" {
			for range soakRounds(t) {
				for _, kill := range []bool{false, true} {
					for n := 1; n <= 3; n++ {
						if n > 1 && once {
							break
						}
						cases = append(cases, stepCase{step: step, n: n, kill: kill})
					}
				}
			}
			continue
		}
		n := 1
		if !once {
			n = 1 + rng.IntN(3)
		}
		cases = append(cases, stepCase{step: step, n: n, kill: rng.IntN(2) == 0})
	}
	for _, sc := range cases {
		t.Run(sc.String(), func(t *testing.T) { runStepCase(t, sc) })
	}
}

// soakRounds is how many times `make soak` runs the whole set of step
// cases: OUTBOX_SOAK_ROUNDS, 3 unless set (about 4.5 minutes a round on
// two cores). Each round draws its own workload timing, so the same step
// and occurrence fall at other places in the stream.
func soakRounds(t *testing.T) int {
	s := os.Getenv("OUTBOX_SOAK_ROUNDS")
	if s == "" {
		return 3
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("OUTBOX_SOAK_ROUNDS=%q: want a positive whole number", s)
	}
	return n
}
