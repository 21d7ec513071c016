// Package testenv starts the real services the integration tests run against:
// throwaway PostgreSQL clusters (internal/localenv's, removed at the test's
// end) and the real Apache Kafka broker (scripts/kafka.sh). When CI=true a
// service that cannot be started fails the test; it never becomes a skip.
// Programs (the demo, the bench) use internal/localenv instead: this package
// links the testing package.
package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/localenv"
)

// What the tests use of internal/localenv, under the names they know.
type PGOptions = localenv.PGOptions

var (
	RepoRoot        = localenv.RepoRoot
	PGBinDir        = localenv.PGBinDir
	PGVersionBinDir = localenv.PGVersionBinDir
	FreePort        = localenv.FreePort
	FindJava        = localenv.FindJava
	SchemaFiles     = localenv.SchemaFiles
	WaitKafka       = localenv.WaitKafka
	NewPostgres     = localenv.NewPostgres
)

// Unavailable fails the test when CI=true and skips it otherwise: a laptop
// without Kafka may skip, CI never does.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("required service unavailable in CI: %s", msg)
	}
	t.Skipf("service unavailable (set CI=true to make this a failure): %s", msg)
}

// Postgres is one throwaway cluster of a test (see localenv.Postgres).
type Postgres struct{ *localenv.Postgres }

// StartPostgres initdb's and starts a cluster for the test, applies sql/ to
// the database "outbox" and removes everything when the test ends.
func StartPostgres(t testing.TB, opts PGOptions) *Postgres {
	t.Helper()
	pg, err := localenv.NewPostgres(opts)
	if err != nil {
		Unavailable(t, "start PostgreSQL: %v", err)
	}
	t.Cleanup(pg.Destroy)
	t.Logf("PostgreSQL %s on 127.0.0.1:%d (%s)", pg.Version, pg.Port, pg.Dir)
	return &Postgres{pg}
}

// Conn opens a pgx connection to db as the superuser, closed at test end.
func (pg *Postgres) Conn(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, pg.DSN(db))
	if err != nil {
		t.Fatalf("connect to %s: %v", db, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// StartStandby makes a streaming physical standby of pg (pg_basebackup),
// removed when the test ends.
func (pg *Postgres) StartStandby(t testing.TB, settings map[string]string) *Postgres {
	t.Helper()
	sb, err := pg.NewStandby(settings)
	if err != nil {
		Unavailable(t, "start a standby: %v", err)
	}
	t.Cleanup(sb.Destroy)
	t.Logf("standby of 127.0.0.1:%d on 127.0.0.1:%d (%s)", pg.Port, sb.Port, sb.Dir)
	return &Postgres{sb}
}

// InvalidateSlot pushes WAL past max_slot_wal_keep_size (which the cluster
// must set small, e.g. 32MB) and checkpoints until the stopped consumer's
// slot is invalidated (wal_status lost), failing the test after ten rounds.
// It returns the rounds it took.
func InvalidateSlot(t testing.TB, conn *pgx.Conn, slot string) int {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS wal_filler (b text)"); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		var status string
		if err := conn.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status); err != nil {
			t.Fatalf("read slot %s: %v", slot, err)
		}
		if status == "lost" {
			return i
		}
		if i == 10 {
			t.Fatalf("slot %s not invalidated after %d rounds of WAL (wal_status %q): is max_slot_wal_keep_size small?", slot, i, status)
		}
		for _, q := range []string{
			"INSERT INTO wal_filler SELECT repeat(md5(g::text), 32) FROM generate_series(1, 20000) g",
			"SELECT pg_switch_wal()", "CHECKPOINT",
		} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
}
