// Package pgdurable makes a PostgreSQL connection's commits durable whatever
// the database or role sets: the connector's own writes (a dead letter in
// the table, the state row, the lease) are what later decisions stand on,
// and with synchronous_commit off a crash could lose one the rest of the
// system already counts (the exactly-once position counting a stored dead
// letter; a confirmed slot position ahead of the state row's promise).
package pgdurable

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Ensure sets synchronous_commit on for conn's session when it is off; a
// stricter setting (remote_write, remote_apply) or local is kept.
func Ensure(ctx context.Context, conn *pgx.Conn) error {
	var sc string
	if err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
		return fmt.Errorf("read synchronous_commit: %w", err)
	}
	if sc != "off" {
		return nil
	}
	if _, err := conn.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		return fmt.Errorf("set synchronous_commit = on: %w", err)
	}
	return nil
}
