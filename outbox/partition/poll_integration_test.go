package partition_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

// TestPollPreparedMaintain: a partitioned outbox prepared for poll mode
// (PostgreSQL 17: an identity column on a partitioned table). Maintain goes
// on creating partitions (LIKE ... EXCLUDING IDENTITY: a partition with an
// identity of its own cannot be attached), and keeps an expired partition
// while it holds a row the relay has not published (the table is then the
// only copy of the event), dropping it once the row is published.
func TestPollPreparedMaintain(t *testing.T) {
	bin, err := testenv.PGVersionBinDir(17)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL 17: %v", err)
	}
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true, BinDir: bin})
	root := testenv.RepoRoot()
	for _, f := range []string{"variants/outbox_partitioned.sql", "003_dead_letter.sql", "variants/outbox_poll.sql"} {
		if err := pg.Psql("outbox", "-q", "-v", "ON_ERROR_STOP=1", "-f", filepath.Join(root, "sql", f)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	id := uuid.NewString()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'A', 'k', 'T', '{}')`, id); err != nil {
		t.Fatal(err)
	}
	today := "outbox_p" + time.Now().UTC().Format("20060102")
	later := partition.Config{Now: func() time.Time { return time.Now().Add(5 * 24 * time.Hour) }}
	// Five days later, with the relay down all along: today's partition has
	// expired and still holds the unpublished row.
	res, err := partition.Maintain(ctx, conn, later)
	t.Logf("maintain: created %v, dropped %v, err %v", res.Created, res.Dropped, err)
	if len(res.Created) == 0 {
		t.Errorf("no partition created on a poll-prepared outbox: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "keep "+today) || slices.Contains(res.Dropped, today) {
		t.Fatalf("maintain dropped %v (err %v); want %s kept, and said so", res.Dropped, err, today)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, id).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the unpublished row: %d (%v)", n, err)
	}
	// Published: the partition goes.
	if _, err := conn.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	res, err = partition.Maintain(ctx, conn, later)
	if err != nil || !slices.Contains(res.Dropped, today) {
		t.Fatalf("after the row was published: dropped %v, err %v; want %s dropped", res.Dropped, err, today)
	}
}
