package relay

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestPoolCommitsDurably: the connector's pool commits durably where the
// database turns synchronous_commit off (a common tuning), so that a dead
// letter stored in the table, which the exactly-once position then covers,
// survives a crash; a stricter setting is kept. Found by the review of
// issue 16: a crash within the WAL writer's delay lost such an insert,
// and a replay skipped the event as in Kafka.
func TestPoolCommitsDurably(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	for _, tc := range []struct{ database, want string }{{"off", "on"}, {"local", "local"}, {"remote_apply", "remote_apply"}} {
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE outbox SET synchronous_commit = %s", tc.database)); err != nil {
			t.Fatal(err)
		}
		pool, err := openPool(ctx, pg.DSN("outbox"))
		if err != nil {
			t.Fatal(err)
		}
		var got string
		if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got); err != nil {
			t.Fatal(err)
		}
		pool.Close()
		if got != tc.want {
			t.Errorf("database synchronous_commit = %s: the pool's is %s, want %s", tc.database, got, tc.want)
		}
	}
}
