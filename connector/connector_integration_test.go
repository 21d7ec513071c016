package main

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

func connectorEnv(pg *testenv.Postgres, brokers string, extra ...string) map[string]string {
	env := map[string]string{
		"OUTBOX_PG_DSN":           pg.DSN("outbox"),
		"OUTBOX_KAFKA_BROKERS":    brokers,
		"OUTBOX_HTTP_ADDR":        "127.0.0.1:0", // a free port: tests run side by side
		"OUTBOX_STATUS_INTERVAL":  "200ms",
		"OUTBOX_TOPIC_PARTITIONS": "3",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env
}

func waitOutput(t testing.TB, p *testenv.Proc, substr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Output(), substr) {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("connector never logged %q (exited=%v); output:\n%s", substr, p.Exited(), tail(p.Output()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string) string {
	if len(s) > 6000 {
		return s[len(s)-6000:]
	}
	return s
}

// TestKill9Repeatedly kills the connector with SIGKILL 20 times at random
// moments while events are written: nothing is lost, nothing is delivered
// twice to a read_committed consumer (the exactly-once position travels in
// each Kafka transaction, and a restart skips what it covers), and each
// aggregate stays in commit order.
func TestKill9Repeatedly(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	aggType := fmt.Sprintf("kill%d", time.Now().UnixNano()%1e9)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	env := connectorEnv(pg, brokers)
	bw := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 200, time.Millisecond)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	const kills = 20
	var runs []*testenv.Proc
	for i := 0; i < kills; i++ {
		p := testenv.StartProc(t, bin, env)
		runs = append(runs, p)
		waitOutput(t, p, "msg=streaming", 60*time.Second)
		time.Sleep(time.Duration(100+rng.Intn(900)) * time.Millisecond)
		p.Signal(syscall.SIGKILL)
		p.Wait(t, 10*time.Second)
	}
	want := bw.Halt()
	p := testenv.StartProc(t, bin, env)
	c.WaitFor(t, want, 2*time.Minute)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Errorf("SIGTERM: exit code %d; output:\n%s", code, tail(p.Output()))
	}
	dups := c.Verify(t, want)
	t.Logf("%d kills with SIGKILL; %d events written (%d writer errors), all delivered in order; %d duplicate deliveries", kills, len(want), bw.Errors(), dups)
	if dups != 0 {
		t.Errorf("%d duplicates across %d kill -9s in exactly-once mode; want 0", dups, kills)
		// What each run read back and resumed from, to tell why.
		for i, r := range append(runs, p) {
			for _, l := range strings.Split(r.Output(), "\n") {
				if strings.Contains(l, "position") || strings.Contains(l, "history") || strings.Contains(l, "streaming") || strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
					t.Logf("run %d: %s", i, l)
				}
			}
		}
	}
}

// TestSIGTERMWhileFlowing: SIGTERM while events flow exits 0, and a restart
// delivers no duplicates of what was confirmed (a graceful stop ends at a
// transaction boundary and confirms everything it published).
func TestSIGTERMWhileFlowing(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	aggType := fmt.Sprintf("term%d", time.Now().UnixNano()%1e9)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	env := connectorEnv(pg, brokers)
	bw := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 50, 0)
	for i := 0; i < 3; i++ {
		p := testenv.StartProc(t, bin, env)
		waitOutput(t, p, "msg=streaming", 60*time.Second)
		time.Sleep(time.Second)
		p.Signal(syscall.SIGTERM)
		start := time.Now()
		if code := p.Wait(t, 60*time.Second); code != 0 {
			t.Fatalf("SIGTERM %d: exit code %d; output:\n%s", i, code, tail(p.Output()))
		}
		if !strings.Contains(p.Output(), "final position confirmed") {
			t.Fatalf("SIGTERM %d: no final confirmation logged:\n%s", i, tail(p.Output()))
		}
		t.Logf("stop %d took %s", i, time.Since(start).Round(time.Millisecond))
		var slotPos string
		cc := pg.Conn(t, "outbox")
		_ = cc.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name='outbox_slot'").Scan(&slotPos)
		for _, l := range strings.Split(p.Output(), "\n") {
			if strings.Contains(l, "final position") || strings.Contains(l, "streaming") || strings.Contains(l, "level=WARN") || strings.Contains(l, "snapshot") {
				t.Logf("  %s", l)
			}
		}
		t.Logf("  slot confirmed after stop: %s", slotPos)
	}
	want := bw.Halt()
	p := testenv.StartProc(t, bin, env)
	c.WaitFor(t, want, 2*time.Minute)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Errorf("final SIGTERM: exit code %d", code)
	}
	dups := c.Verify(t, want)
	t.Logf("%d events across 4 graceful stops, %d duplicates", len(want), dups)
	if dups != 0 {
		t.Errorf("%d duplicates after graceful stops; want 0", dups)
	}
}

// TestLargeTransactionMemory: one transaction of 1,000,000 outbox rows is
// delivered whole; the connector's peak RSS stays under 256 MiB and within
// 64 MiB of its peak for a 10,000-row transaction.
func TestLargeTransactionMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	peak := func(rows int) int64 {
		pg := testenv.StartPostgres(t, testenv.PGOptions{})
		ctx := context.Background()
		conn := pg.Conn(t, "outbox")
		aggType := fmt.Sprintf("big%d", time.Now().UnixNano()%1e9)
		p := testenv.StartProc(t, bin, connectorEnv(pg, brokers))
		waitOutput(t, p, "msg=streaming", 60*time.Second)
		start := time.Now()
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT gen_random_uuid(), $1, 'agg-' || (i % 1000), 'Big', jsonb_build_object('i', i, 'pad', repeat('x', 100))
			FROM generate_series(1, $2) AS i`, aggType, rows); err != nil {
			t.Fatal(err)
		}
		var end string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
			t.Fatal(err)
		}
		// Delivered whole: the slot confirms past the transaction only once
		// every record is acked, and the topic holds exactly rows records.
		deadline := time.Now().Add(5 * time.Minute)
		for {
			var caught bool
			if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outbox_slot'", end).Scan(&caught); err != nil {
				t.Fatal(err)
			}
			if caught {
				break
			}
			if time.Now().After(deadline) || p.Exited() {
				t.Fatalf("%d-row transaction not confirmed within 5 minutes; output:\n%s", rows, tail(p.Output()))
			}
			time.Sleep(200 * time.Millisecond)
		}
		elapsed := time.Since(start)
		// Counted from the record batches: with Kafka transactions, offsets
		// also count the commit markers.
		n, err := testenv.CommittedRecords(ctx, brokers, "outbox.event."+aggType)
		if err != nil {
			t.Fatal(err)
		}
		if n != int64(rows) {
			t.Fatalf("topic holds %d records, want %d", n, rows)
		}
		rss, err := p.PeakRSS()
		if err != nil {
			t.Fatal(err)
		}
		p.Signal(syscall.SIGTERM)
		p.Wait(t, 60*time.Second)
		t.Logf("%d-row transaction: delivered and confirmed in %s; connector peak RSS %.1f MiB", rows, elapsed.Round(time.Millisecond), float64(rss)/(1<<20))
		return rss
	}
	small := peak(10_000)
	big := peak(1_000_000)
	if big > 256<<20 {
		t.Errorf("peak RSS %.1f MiB for 1,000,000 rows; want under 256 MiB", float64(big)/(1<<20))
	}
	if big-small > 64<<20 {
		t.Errorf("peak RSS grew from %.1f MiB (10,000 rows) to %.1f MiB (1,000,000 rows); want within 64 MiB", float64(small)/(1<<20), float64(big)/(1<<20))
	}
}
