package collect

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

var record = flag.Bool("record", false, "rewrite testdata/pg<major>.json from the real PostgreSQL of each major that TestQueriesOnRealVersions starts")

// startSlots starts a cluster with a lagging logical slot, a streaming
// logical slot (pg_recvlogical), a physical slot with reserved WAL and a
// temporary slot held by the returned connection.
func startSlots(t *testing.T) *testenv.Postgres {
	t.Helper()
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true, Settings: map[string]string{
		"max_slot_wal_keep_size": "'1GB'",
	}})
	ctx := context.Background()
	c := pg.Conn(t, "outbox")
	for _, q := range []string{
		"SELECT pg_create_logical_replication_slot('outbox_slot', 'pgoutput')",
		"SELECT pg_create_logical_replication_slot('streamed', 'test_decoding')",
		"SELECT pg_create_physical_replication_slot('standby_1', true)",
		"SELECT pg_create_logical_replication_slot('tmp', 'test_decoding', true)",
		"CREATE TABLE t (id int)",
		"INSERT INTO t SELECT generate_series(1, 1000)",
		"SELECT pg_logical_emit_message(true, 'x', repeat('x', 100000))",
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cmd := exec.Command(filepath.Join(pg.BinDir, "pg_recvlogical"), "-d", pg.DSN("outbox"), "-S", "streamed", "--start", "-f", "/dev/null", "-s", "1")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatalf("pg_recvlogical: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Wait for the WAL sender to appear.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE reply_time IS NOT NULL").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_recvlogical did not start streaming\n%s", pg.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return pg
}

// TestQueriesOnPostgres runs every version's queries that the installed
// PostgreSQL (15) can answer — those of 13, 14 and 15 — and checks their
// columns: a server reads an older version's queries too. Each version's
// queries on its own server, and the recording of testdata/pg<major>.json,
// are TestQueriesOnRealVersions'.
func TestQueriesOnPostgres(t *testing.T) {
	pg := startSlots(t)
	ctx := context.Background()
	c := pg.Conn(t, "outbox")
	var num int
	if err := c.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		t.Fatal(err)
	}
	for major := 13; major <= Major(num); major++ {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			rows := map[string][]row{}
			for view, sql := range viewQueries(major * 10000) {
				got, err := queryRows(ctx, c, sql)
				if err != nil {
					t.Fatalf("%s query of version %d on PostgreSQL %d: %v", view, major, num, err)
				}
				want := selectColumns(sql)
				for _, r := range got {
					var cols []string
					for k := range r {
						cols = append(cols, k)
					}
					sort.Strings(cols)
					if !slices.Equal(cols, want) {
						t.Errorf("%s: columns %v, want %v", view, cols, want)
					}
				}
				rows[view] = got
			}
			snap, err := parseRecorded(major*10000, rows)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if len(snap.Slots) != 4 {
				t.Errorf("got %d slots, want 4", len(snap.Slots))
			}
		})
	}
}

// TestCollector reads a snapshot through a Collector, as slotwatch does.
func TestCollector(t *testing.T) {
	pg := startSlots(t)
	col, err := New(pg.DSN("outbox"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer col.Close(ctx)
	snap, err := col.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.WALPosition == 0 || snap.InRecovery {
		t.Errorf("WAL position %s, in recovery %v", snap.WALPosition, snap.InRecovery)
	}
	byName := map[string]Slot{}
	for _, s := range snap.Slots {
		byName[s.Name] = s
	}
	if s := byName["streamed"]; !s.Active || s.ActivePID == 0 {
		t.Errorf("streamed slot not active: %+v", s)
	}
	if s := byName["outbox_slot"]; s.Active || s.Plugin != "pgoutput" || s.Type != "logical" || s.CatalogXminAge == nil || s.WALStatus != "reserved" || s.SafeWALSize == nil {
		t.Errorf("outbox_slot: %+v", s)
	}
	if s := byName["standby_1"]; s.Type != "physical" || s.RestartLSN == 0 || s.ConfirmedFlushLSN != 0 {
		t.Errorf("standby_1: %+v", s)
	}
	if s := byName["tmp"]; !s.Temporary {
		t.Errorf("tmp not temporary: %+v", s)
	}
	var sender bool
	for _, s := range snap.Senders {
		if s.PID == byName["streamed"].ActivePID {
			sender = true
		}
	}
	if !sender {
		t.Errorf("no pg_stat_replication row for the streamed slot: %+v", snap.Senders)
	}
	if _, ok := snap.SlotStats["outbox_slot"]; !ok {
		t.Errorf("no pg_stat_replication_slots row: %+v", snap.SlotStats)
	}
	if snap.Settings.MaxSlotWALKeepSize == nil || *snap.Settings.MaxSlotWALKeepSize != 1<<30 {
		t.Errorf("max_slot_wal_keep_size = %v, want 1 GiB", snap.Settings.MaxSlotWALKeepSize)
	}
	if snap.WALDir == nil || snap.WALDir.Bytes < 16<<20 {
		t.Errorf("WAL dir = %+v, want at least one segment (superuser may list it)", snap.WALDir)
	}
}
