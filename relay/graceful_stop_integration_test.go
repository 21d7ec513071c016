package relay

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestGracefulStopDuringSetup (review finding L1): a graceful stop that
// arrives while a session sets up (after the slot is created, before its
// snapshot is imported) or takes the initial snapshot ends the session with
// an error of its cancelled context; Run returned it, so the process exited
// non-zero with "context canceled". Run returns nil, and the next start
// takes the snapshot again: every event arrives.
func TestGracefulStopDuringSetup(t *testing.T) {
	for _, step := range []fault.Step{fault.SlotCreated, fault.SnapshotRow} {
		t.Run(string(step), func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("gstop")
			w := testenv.NewWriter()
			w.Write(t, ctx, conn, aggType, 30, 3, 5)

			reached, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			hook := func(s fault.Step) error {
				if s == step {
					once.Do(func() {
						close(reached)
						<-release
					})
				}
				return nil
			}
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			run := startRelayFaults(t, cfg, route.DefaultConfig(), hook)
			select {
			case <-reached:
			case err := <-run.done:
				t.Fatalf("relay exited before %s: %v", step, err)
			case <-time.After(30 * time.Second):
				t.Fatalf("the session did not reach %s within 30s", step)
			}
			run.cancel() // SIGTERM
			run.cancel = nil
			close(release)
			select {
			case err := <-run.done:
				if err != nil {
					t.Fatalf("a graceful stop at %s: Run returned %v; want nil (exit 0)", step, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("relay did not stop within 30s of a graceful stop at %s", step)
			}

			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			run = startRelay(t, cfg)
			c.WaitFor(t, w.Events, time.Minute)
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			c.Verify(t, w.Events)
		})
	}
}
