package partition_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

// partitionedPostgres starts a cluster with the partitioned variant in place
// of sql/001 and sql/002, and the rest of sql/ as usual.
func partitionedPostgres(t *testing.T) *testenv.Postgres {
	t.Helper()
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	if err := pg.Psql("outbox", "-f", filepath.Join(testenv.RepoRoot(), "sql", "variants", "outbox_partitioned.sql")); err != nil {
		t.Fatal(err)
	}
	files, err := testenv.SchemaFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "001_") || strings.HasPrefix(base, "002_") {
			continue
		}
		if err := pg.Psql("outbox", "-f", f); err != nil {
			t.Fatal(err)
		}
	}
	return pg
}

func startConnector(t *testing.T, pg *testenv.Postgres, brokers string) *testenv.Proc {
	t.Helper()
	return startConnectorEnv(t, pg, brokers, nil)
}

// startConnectorEnv is startConnector with extra settings.
func startConnectorEnv(t *testing.T, pg *testenv.Postgres, brokers string, extra map[string]string) *testenv.Proc {
	t.Helper()
	port, _ := testenv.FreePort()
	env := map[string]string{
		"OUTBOX_PG_DSN": pg.DSN("outbox"), "OUTBOX_KAFKA_BROKERS": brokers,
		"OUTBOX_HTTP_ADDR": fmt.Sprintf("127.0.0.1:%d", port), "OUTBOX_STATUS_INTERVAL": "200ms",
		"OUTBOX_TOPIC_PARTITIONS": "3",
	}
	for k, v := range extra {
		env[k] = v
	}
	p := testenv.StartProc(t, testenv.Binary(t, "connector"), env)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.Output(), "msg=streaming") {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("connector did not start streaming; output:\n%s", p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// TestMaintainDropsOldPartitionsWhileConnectorRuns: events are written into
// old days' partitions, some while the connector is stopped; Maintain drops
// those partitions (some before the connector decoded their inserts) and
// creates the coming days' while events keep flowing: every event is
// delivered, and the expired partitions are gone.
func TestMaintainDropsOldPartitionsWhileConnectorRuns(t *testing.T) {
	pg := partitionedPostgres(t)
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	writeConn := pg.Conn(t, "outbox")
	now := time.Now().UTC()
	today := now.Truncate(24 * time.Hour)
	// Old partitions, as earlier maintenance runs would have made them.
	for d := 1; d <= 5; d++ {
		day := today.AddDate(0, 0, -d)
		if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')`,
			partition.Name("outbox", day), day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339))); err != nil {
			t.Fatal(err)
		}
	}
	aggType := fmt.Sprintf("part%d", time.Now().UnixNano()%1e9)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	p := startConnector(t, pg, brokers)

	var mu sync.Mutex
	var want []testenv.Event
	seq := 0
	// write puts n events, each on a day 0..5 days back (round robin), in
	// transactions of 5.
	write := func(n int) {
		t.Helper()
		for i := 0; i < n; i += 5 {
			var evs []outbox.Event
			mu.Lock()
			for j := 0; j < 5; j++ {
				seq++
				back := seq % 6
				evs = append(evs, outbox.Event{AggregateType: aggType, AggregateID: fmt.Sprintf("a%d", seq%10), Type: "T",
					Payload: map[string]int{"seq": seq}, Columns: map[string]any{"created_at": now.AddDate(0, 0, -back)}})
			}
			mu.Unlock()
			var ids []uuid.UUID
			err := pgx.BeginFunc(ctx, writeConn, func(tx pgx.Tx) (err error) {
				ids, err = outbox.Write(ctx, tx, evs...)
				return err
			})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for k, id := range ids {
				want = append(want, testenv.Event{ID: id.String()})
				_ = k
			}
			mu.Unlock()
		}
	}
	write(500)
	// Stop the connector, write into the old partitions, drop them: the
	// connector decodes those inserts after their tables are gone.
	p.Signal(syscall.SIGTERM)
	p.Wait(t, 60*time.Second)
	write(500)
	cfg := partition.Config{Retention: 48 * time.Hour, Ahead: 3}
	res, err := partition.Maintain(ctx, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("maintain: created %v, dropped %v", res.Created, res.Dropped)
	// Days 3..5 back ended more than 48h ago; days 1 and 2 back did not.
	wantDropped := []string{partition.Name("outbox", today.AddDate(0, 0, -5)), partition.Name("outbox", today.AddDate(0, 0, -4)), partition.Name("outbox", today.AddDate(0, 0, -3))}
	if fmt.Sprint(res.Dropped) != fmt.Sprint(wantDropped) {
		t.Errorf("dropped %v, want %v", res.Dropped, wantDropped)
	}
	wantCreated := []string{partition.Name("outbox", today.AddDate(0, 0, 2)), partition.Name("outbox", today.AddDate(0, 0, 3))}
	if fmt.Sprint(res.Created) != fmt.Sprint(wantCreated) {
		t.Errorf("created %v, want %v (today and tomorrow come with the schema)", res.Created, wantCreated)
	}
	p = startConnector(t, pg, brokers)
	// While the connector runs: writes (old days now land in the DEFAULT
	// partition, or in days 1 and 2 back) and maintenance that drops day 2
	// back under a shorter retention.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); write(1000) }()
	time.Sleep(300 * time.Millisecond)
	cfg.Retention = 24 * time.Hour
	res2, err := partition.Maintain(ctx, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res2.Dropped) != fmt.Sprint([]string{partition.Name("outbox", today.AddDate(0, 0, -2))}) {
		t.Errorf("second run dropped %v", res2.Dropped)
	}
	wg.Wait()
	res3, err := partition.Maintain(ctx, conn, cfg)
	if err != nil || len(res3.Created)+len(res3.Dropped) != 0 {
		t.Errorf("a repeated run changed %v (err %v); want nothing", res3, err)
	}
	mu.Lock()
	all := append([]testenv.Event(nil), want...)
	mu.Unlock()
	c.WaitFor(t, all, 2*time.Minute)
	var parts int
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.outbox'::regclass`).Scan(&parts)
	t.Logf("%d events delivered; %d partitions dropped in all (3 of them while the connector was stopped, before it decoded their inserts); %d partitions left", len(all), len(res.Dropped)+len(res2.Dropped), parts)
	p.Signal(syscall.SIGTERM)
	p.Wait(t, 60*time.Second)
}

// TestMaintainRefusesPlainTable names the fix when the table is not
// partitioned.
func TestMaintainRefusesPlainTable(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	_, err := partition.Maintain(context.Background(), pg.Conn(t, "outbox"), partition.Config{})
	if err == nil || !strings.Contains(err.Error(), "not a partitioned table") {
		t.Fatalf("err = %v; want one saying the table is not partitioned", err)
	}
}
