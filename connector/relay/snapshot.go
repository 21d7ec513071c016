package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/connector/tracker"
	"github.com/pgoutbox/pgoutbox/connector/wal"
	"github.com/pgoutbox/pgoutbox/outbox-router/route"
)

// snapshot is an open repeatable-read transaction on a second connection,
// importing the snapshot the slot exported, so that the rows it reads are
// exactly those committed before the slot's consistent point.
type snapshot struct {
	conn *pgx.Conn
	tx   pgx.Tx
}

func (r *Relay) openSnapshot(ctx context.Context, name string) (*snapshot, error) {
	conn, err := pgx.Connect(ctx, r.cfg.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("connect for the initial snapshot: %w", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("begin the initial snapshot: %w", err)
	}
	if name != "" {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET TRANSACTION SNAPSHOT '%s'", name)); err != nil {
			conn.Close(ctx)
			return nil, fmt.Errorf("import snapshot %q: %w", name, err)
		}
	}
	return &snapshot{conn: conn, tx: tx}, nil
}

func (s *snapshot) close(ctx context.Context) {
	_ = s.tx.Rollback(context.WithoutCancel(ctx))
	_ = s.conn.Close(context.WithoutCancel(ctx))
}

// publishSnapshot publishes every row of the outbox table in the snapshot,
// in insertion order as far as the table can tell (created_at, then physical
// order), and waits until Kafka acked them all.
func (r *Relay) publishSnapshot(ctx context.Context, s *snapshot, tr *tracker.Tracker, out chan<- wal.Event, at uint64) error {
	var hasCreated bool
	if err := s.tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = $2 AND column_name = 'created_at')`, r.schema, r.table).Scan(&hasCreated); err != nil {
		return fmt.Errorf("inspect %s.%s: %w", r.schema, r.table, err)
	}
	q := fmt.Sprintf("SELECT * FROM %s.%s", r.schema, r.table)
	if hasCreated {
		q += " ORDER BY created_at, ctid"
	} else {
		q += " ORDER BY ctid"
	}
	// The simple protocol returns every value in text format, as pgoutput
	// does, so snapshot rows route exactly like streamed ones.
	rows, err := s.tx.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return fmt.Errorf("read the initial snapshot of %s.%s: %w", r.schema, r.table, err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	txn := tr.Begin(at)
	n := 0
	for rows.Next() {
		raw := rows.RawValues()
		row := &route.Row{Columns: make([]route.Column, len(fields)), Source: route.Source{CommitLSN: at, Table: r.schema + "." + r.table}}
		for i, f := range fields {
			c := &row.Columns[i]
			// RowDescription carries the column's atttypmod, as pgoutput's
			// Relation message does.
			c.Name, c.Type, c.TypeMod, c.HasTypeMod = f.Name, f.DataTypeOID, f.TypeModifier, true
			if raw[i] == nil {
				c.Null = true
			} else {
				c.Value = append([]byte(nil), raw[i]...)
			}
		}
		txn.Add()
		select {
		case out <- wal.Event{Txn: txn, Row: row}:
		case <-ctx.Done():
			txn.Abandon()
			return ctx.Err()
		}
		n++
	}
	if err := rows.Err(); err != nil {
		txn.Abandon()
		return fmt.Errorf("read the initial snapshot of %s.%s: %w", r.schema, r.table, err)
	}
	txn.Commit(at)
	r.metrics.SnapshotEvents.Add(float64(n))
	for !tr.Idle() {
		select {
		case <-tr.Changed():
		case <-time.After(time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.log.Info("initial snapshot published", "rows", n, "lsn", wal.FormatLSN(at))
	return nil
}
