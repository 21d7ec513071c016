package main

import (
	"fmt"
	"math/rand"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestRecoverCommand: the connector is killed (kill -9) while events are
// written, and its slot invalidated for removed WAL (a small
// max_slot_wal_keep_size, WAL pushed past it, a checkpoint) while it is
// down. A plain start refuses, exits non-zero and names the way out;
// `connector recover` replaces the slot and publishes the gap again from
// the outbox table, and is itself killed (kill -9) at a random moment of
// it; the next `connector recover` finishes. Every event is delivered, in
// per-aggregate order.
func TestRecoverCommand(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"max_slot_wal_keep_size": "32MB"}})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	conn := pg.Conn(t, "outbox")
	aggType := fmt.Sprintf("recover%d", time.Now().UnixNano()%1e9)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	env := connectorEnv(pg, brokers)
	load := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 50, time.Millisecond)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))

	p := testenv.StartProc(t, bin, env)
	waitOutput(t, p, "msg=streaming", 60*time.Second)
	time.Sleep(time.Duration(500+rng.Intn(1000)) * time.Millisecond)
	p.Signal(syscall.SIGKILL)
	p.Wait(t, 10*time.Second)

	// WAL past max_slot_wal_keep_size while the connector is down.
	testenv.InvalidateSlot(t, conn, "outbox_slot")

	refused := testenv.StartProc(t, bin, env)
	if code := refused.Wait(t, 60*time.Second); code == 0 || !strings.Contains(refused.Output(), "OUTBOX_ON_SLOT_LOSS=recover") {
		t.Fatalf("a plain start on the invalidated slot exited %d; want a refusal naming OUTBOX_ON_SLOT_LOSS=recover:\n%s", code, tail(refused.Output()))
	}

	r1 := testenv.StartProc(t, bin, env, "recover")
	waitOutput(t, r1, "recovering", 60*time.Second)
	time.Sleep(time.Duration(rng.Intn(150)) * time.Millisecond)
	r1.Signal(syscall.SIGKILL)
	r1.Wait(t, 10*time.Second)
	killedIn := "the window"
	if strings.Contains(r1.Output(), "recovery window published") {
		killedIn = "streaming, after the window was published"
	}

	r2 := testenv.StartProc(t, bin, env, "recover")
	waitOutput(t, r2, "msg=streaming", 60*time.Second)
	time.Sleep(500 * time.Millisecond)
	want := load.Halt()
	c.WaitFor(t, want, 2*time.Minute)
	r2.Signal(syscall.SIGTERM)
	if code := r2.Wait(t, 60*time.Second); code != 0 {
		t.Errorf("SIGTERM: exit code %d; output:\n%s", code, tail(r2.Output()))
	}
	dups := c.Verify(t, want)
	var resumed string
	for _, l := range strings.Split(r2.Output(), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, " published") {
			resumed += "\n  " + l
		}
	}
	t.Logf("%d events, all delivered in order after kill -9, an invalidated slot and a recovery killed once (in %s); %d duplicates. The second start:%s", len(want), killedIn, dups, resumed)
}
