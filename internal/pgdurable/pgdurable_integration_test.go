package pgdurable

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestEnsure: a session of a database that turns synchronous_commit off
// commits durably after Ensure; local and stricter settings are kept.
func TestEnsure(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	for _, tc := range []struct{ database, want string }{{"off", "on"}, {"local", "local"}, {"remote_apply", "remote_apply"}} {
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE outbox SET synchronous_commit = %s", tc.database)); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, pg.DSN("outbox"))
		if err != nil {
			t.Fatal(err)
		}
		if err := Ensure(ctx, conn); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if got != tc.want {
			t.Errorf("database synchronous_commit = %s: the session's is %s after Ensure, want %s", tc.database, got, tc.want)
		}
	}
}
