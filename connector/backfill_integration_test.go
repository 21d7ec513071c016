package main

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestBackfill: 30,000 rows (100,000 under make soak) of one aggregate type, streamed once by the
// running connector, are published again by connector backfill (that type,
// a time range) while the connector goes on streaming another type's
// events. The backfill prints its progress, is killed (kill -9) once it has
// published some, and the same command resumes it after the last batch
// Kafka acknowledged. Every backfilled event is in Kafka at least twice
// (the stream's and the backfill's, same id), at most one batch more; the
// streamed type's events are all delivered meanwhile.
func TestBackfill(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	suffix := time.Now().UnixNano() % 1e9
	old, live := fmt.Sprintf("bfold%d", suffix), fmt.Sprintf("bflive%d", suffix)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+old, "outbox.event."+live)
	env := connectorEnv(pg, brokers)
	p := testenv.StartProc(t, bin, env)
	waitOutput(t, p, "msg=streaming", 60*time.Second)

	from := time.Now().Add(-time.Second).UTC()
	n := 30_000
	if os.Getenv("OUTBOX_SOAK") == "1" {
		n = 100_000
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), $1, 'agg-' || (g % 100), 'Backfilled', jsonb_build_object('n', g) FROM generate_series(1, $2) g`, old, n); err != nil {
		t.Fatal(err)
	}
	waitDistinct(t, c, old, n, 2*time.Minute)
	load := testenv.StartLoad(t, pg.DSN("outbox"), live, 20, 2*time.Millisecond)

	// No -to: the first run fixes the end of the range at its start, and
	// the same command resumes that run.
	args := []string{"backfill", "-from", from.Format(time.RFC3339Nano), "-aggregate-type", old, "-batch", "500"}
	b1 := testenv.StartProc(t, bin, env, args...)
	// Killed once the run has recorded more than 5000 rows done, read from
	// its table: the printed progress comes every few seconds, and in CI
	// its first line came at 27,500 of 30,000, so that the run finished
	// before the kill and the second one had nothing to resume.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var done int64
		if err := conn.QueryRow(ctx, "SELECT done FROM outbox_backfill").Scan(&done); err == nil && done > 5000 {
			break
		}
		if b1.Exited() || time.Now().After(deadline) {
			t.Fatalf("the backfill recorded no progress past 5000 rows (exited %v):\n%s", b1.Exited(), tail(b1.Output()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Duration(rand.Intn(300)) * time.Millisecond)
	b1.Signal(syscall.SIGKILL)
	b1.Wait(t, 10*time.Second)
	var doneAtKill int64
	if err := conn.QueryRow(ctx, "SELECT done FROM outbox_backfill").Scan(&doneAtKill); err != nil {
		t.Fatal(err)
	}

	b2 := testenv.StartProc(t, bin, env, args...)
	if code := b2.Wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("the resumed backfill exited %d:\n%s", code, tail(b2.Output()))
	}
	if !strings.Contains(b2.Output(), "resuming backfill") || !strings.Contains(b2.Output(), fmt.Sprintf("%d of %d rows (100.0%%)", n, n)) {
		t.Fatalf("the second run did not resume and finish:\n%s", tail(b2.Output()))
	}
	want := load.Halt()
	c.WaitFor(t, want, 2*time.Minute)
	// Every backfilled event twice: wait until the topic holds them all.
	var counts map[string]int
	eventually := time.Now().Add(2 * time.Minute)
	for {
		counts = map[string]int{}
		for _, r := range c.Records() {
			if r.Topic == "outbox.event."+old {
				counts[testenv.Header(r, "id")]++
			}
		}
		twice := 0
		for _, k := range counts {
			if k >= 2 {
				twice++
			}
		}
		if twice == n {
			break
		}
		if time.Now().After(eventually) {
			t.Fatalf("%d of %d backfilled events are in Kafka twice", twice, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	extra := 0
	for _, k := range counts {
		extra += k - 2
	}
	if extra > 500 {
		t.Errorf("%d records beyond two per event: the resumed run repeated more than one batch", extra)
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Errorf("connector exit code %d", code)
	}
	dups := c.Verify(t, want)
	var progress []string
	re := regexp.MustCompile(`: (\d+) of (\d+) rows`)
	for _, l := range strings.Split(b1.Output()+b2.Output(), "\n") {
		if re.MatchString(l) {
			progress = append(progress, l)
		}
	}
	t.Logf("backfill of %d rows while streaming: killed at %d recorded done, resumed; %d records beyond two per event; %d live events delivered (%d duplicates). Progress lines: %d, last: %s",
		n, doneAtKill, extra, len(want), dups, len(progress), progress[len(progress)-1])
}

// waitDistinct waits until c consumed n distinct events of aggType.
func waitDistinct(t *testing.T, c *testenv.Consumer, aggType string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		seen := map[string]bool{}
		for _, r := range c.Records() {
			if r.Topic == "outbox.event."+aggType {
				seen[testenv.Header(r, "id")] = true
			}
		}
		if len(seen) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events of %s consumed within %s", len(seen), n, aggType, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
