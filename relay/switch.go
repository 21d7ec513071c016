package relay

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/relay/checkpoint"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/poll"
)

// Switching between the two relay kinds (README, "Switching between the WAL
// relay and poll mode").
//
// WAL → poll: sql/variants/outbox_poll.sql adds published_at NULL to every
// row, and poll mode would publish the whole retention window again.
// MarkDelivered marks the rows the WAL relay's state row proves delivered:
// those written by a transaction older than its recovery point
// (checkpoint.Point: every event written by a transaction below it was
// delivered). The rest stay unpublished, and poll mode publishes them:
// duplicates, never a loss. The variant's ALTER TABLE rewrites the table
// (its identity column), stamping every row with its own transaction id;
// a point taken after it covers them all, since every transaction that had
// written a row committed before the ALTER took its lock. So run it once
// the WAL relay has written its state after the variant (within
// OUTBOX_STATUS_INTERVAL while it streams); run again, it marks what the
// newer point covers.
//
// Poll → WAL: a slot created without a snapshot (OUTBOX_SNAPSHOT=never)
// streams what commits after it; rows poll mode had not published before it
// would be lost unless poll mode goes on until they are. checkPollHandover
// refuses that start when no poll reader is running and such rows exist.
// With poll readers running, awaitPollHandover holds the stream until they
// have published every row committed before the slot: streamed at once, an
// aggregate's event committed after the slot could reach Kafka before its
// earlier one still waiting for poll mode.

// switchWait bounds how long MarkDelivered waits for the WAL relay to
// record a recovery point newer than its own start.
const switchWait = 2 * time.Minute

// queryDelivered marks, in batches, the unpublished rows written by a
// transaction older than the point $1 (the negation of windowWhere,
// without its time bound: a row is delivered when its writer is older than
// the point, whenever it was created).
func queryDelivered(tbl, id string) string {
	cond := "published_at IS NULL AND NOT " + windowWhere(false)
	return fmt.Sprintf(`UPDATE %[1]s SET published_at = now() WHERE %[2]s AND %[3]s IN (SELECT %[3]s FROM %[1]s WHERE %[2]s LIMIT 10000)`, tbl, cond, id)
}

// MarkDelivered marks published the rows of the outbox the WAL relay of
// cfg.Slot has delivered, for a switch to poll mode, and prints what it did
// to out. It returns the rows marked and those left for poll mode.
func MarkDelivered(ctx context.Context, cfg config.Config, idColumn string, out io.Writer) (marked, left int64, err error) {
	conn, err := pgx.Connect(ctx, cfg.PGDSN)
	if err != nil {
		return 0, 0, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tbl := pgx.Identifier{cfg.Table.Schema, cfg.Table.Name}.Sanitize()
	prepared, err := pollPrepared(ctx, conn, tbl)
	if err != nil {
		return 0, 0, err
	}
	if !prepared {
		return 0, 0, fatal.Errorf("%s has no column %s: apply sql/variants/outbox_poll.sql first, while the WAL relay still runs", tbl, poll.Published)
	}
	// The point must be newer than this command: every transaction older
	// than it, the variant's table rewrite included (it stamps every row
	// with its own transaction id), then wrote only delivered events.
	// Taken too early, the point predates the rewrite and marks nothing,
	// and poll mode would publish the whole table again. A streaming WAL
	// relay writes a newer point within OUTBOX_STATUS_INTERVAL.
	var started uint64
	if err := conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&started); err != nil {
		return 0, 0, fmt.Errorf("read the current transaction id: %w", err)
	}
	st, has, err := checkpoint.LoadState(ctx, conn, cfg.Slot)
	for deadline := time.Now().Add(switchWait); err == nil && has && st.Recover.Xmin <= started && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		st, has, err = checkpoint.LoadState(ctx, conn, cfg.Slot)
	}
	if err != nil {
		return 0, 0, err
	}
	if has && !st.Recover.IsZero() && st.Recover.Xmin <= started {
		return 0, 0, fatal.Errorf("the WAL relay of slot %q recorded no recovery point newer than this command within %s (its newest is transaction %d, of %s; this command began at %d). It records a newer one as it delivers events: the outbox had none since (run this while the services write, or again after one event), or the WAL relay does not stream, or its state writes fail, or a transaction older than this command is still open (see pg_stat_activity.backend_xmin). Marked nothing", cfg.Slot, switchWait, st.Recover.Xmin, st.Recover.At.UTC().Format(time.RFC3339), started)
	}
	var system string
	if err := conn.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&system); err != nil {
		return 0, 0, fmt.Errorf("read the cluster's system identifier: %w", err)
	}
	switch {
	case !has || st.Recover.IsZero():
		return 0, 0, fatal.Errorf("slot %q has no state row with a recovery point, so nothing shows which rows the WAL relay delivered: marked nothing, and poll mode will publish every row of %s again (duplicates, never a loss). Run the WAL relay of this version until it has written its state, then run this again", cfg.Slot, tbl)
	case st.SystemID != system:
		return 0, 0, fatal.Errorf("the state row of slot %q was written by another cluster (system identifier %s; this one is %s: a copy or a restore), so its recovery point says nothing of this table's rows: marked nothing", cfg.Slot, st.SystemID, system)
	case !st.SnapshotDone:
		return 0, 0, fatal.Errorf("the WAL relay of slot %q has not completed its snapshot (initial, or a recovery's window): the rows it owes are not delivered; run it until it streams, then run this again", cfg.Slot)
	}
	q := queryDelivered(tbl, pgx.Identifier{idColumn}.Sanitize())
	for {
		tag, err := conn.Exec(ctx, q, int64(st.Recover.Xmin))
		if err != nil {
			return marked, 0, fmt.Errorf("mark the rows the WAL relay delivered: %w", err)
		}
		marked += tag.RowsAffected()
		if tag.RowsAffected() == 0 {
			break
		}
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+tbl+" WHERE "+poll.Published+" IS NULL").Scan(&left); err != nil {
		return marked, 0, fmt.Errorf("count the rows left unpublished: %w", err)
	}
	fmt.Fprintf(out, "marked %d rows of %s published: written before transaction %d, which the WAL relay of slot %q had delivered by %s; %d rows stay unpublished, and poll mode publishes them (those the WAL relay delivered since: duplicates)\n",
		marked, tbl, st.Recover.Xmin, cfg.Slot, st.Recover.At.UTC().Format("2006-01-02T15:04:05Z"), left)
	return marked, left, nil
}

// pollPrepared reports whether the outbox tbl (quoted) was prepared for
// poll mode: it has the column poll mode marks.
func pollPrepared(ctx context.Context, conn *pgx.Conn, tbl string) (bool, error) {
	var prepared bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped)`, tbl, poll.Published).Scan(&prepared); err != nil {
		return false, fmt.Errorf("inspect %s: %w", tbl, err)
	}
	return prepared, nil
}

// checkPollHandover refuses to create a slot without a snapshot on a table
// prepared for poll mode that holds rows not published yet while no poll
// reader runs: the slot streams only what commits after it, and nothing
// would ever publish them.
func (r *Relay) checkPollHandover(ctx context.Context, conn *pgx.Conn) error {
	tbl := pgx.Identifier{r.schema, r.table}.Sanitize()
	prepared, err := pollPrepared(ctx, conn, tbl)
	if err != nil {
		return err
	}
	if !prepared {
		return nil
	}
	var pending bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+tbl+" WHERE "+poll.Published+" IS NULL)").Scan(&pending); err != nil {
		return fmt.Errorf("look for rows poll mode has not published in %s: %w", tbl, err)
	}
	if !pending {
		return nil
	}
	readers, err := poll.Readers(ctx, conn, r.schema, r.table)
	if err != nil {
		return err
	}
	if readers > 0 {
		r.log.Warn("taking over from poll mode: rows poll mode has not published yet are left to it; keep the poll relays running until none written before this start is unpublished (README, switching relays), then stop them",
			"table", tbl, "poll_readers", readers)
		return nil
	}
	return fatal.Errorf("OUTBOX_SNAPSHOT=never on %s, which a poll-mode relay read (it has %s) and which holds rows not published yet, with no poll relay running: the new slot streams only what commits after it, so those events would never be published. "+
		"Start the WAL relay while the poll relays still run and stop them once every row written before it is published (README, switching relays); or start it once with OUTBOX_SNAPSHOT=initial, which publishes every row of the table again (duplicates)", tbl, poll.Published)
}

// awaitPollHandover waits, after the slot exists and before the stream
// starts, until poll mode has published every row committed before the
// slot: those are visible now, so their seq is at most the largest seq of
// the unpublished rows now (a row that commits later, whatever its seq, is
// in the stream). Poll mode publishes them in seq order, so an aggregate's
// earlier events are in Kafka before the stream gives its later ones. No
// such row (or no table prepared for poll mode): nothing to wait for. No
// poll reader running while such rows wait is given three OUTBOX_LEASE_TTLs
// (a rolling restart of the poll relays), then refused: nobody would publish
// them, or a poll relay started later would publish them after the
// stream's newer events of their aggregates. The wait is said in the log
// and, as the session's last error, in the stall reason.
func (r *Relay) awaitPollHandover(ctx context.Context, conn *pgx.Conn) error {
	tbl := pgx.Identifier{r.schema, r.table}.Sanitize()
	seq, err := poll.SeqColumn(ctx, conn, r.schema, r.table)
	if err != nil || seq == "" {
		return err
	}
	col := pgx.Identifier{seq}.Sanitize()
	var most *int64
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT max(%s)::bigint FROM %s WHERE %s IS NULL", col, tbl, poll.Published)).Scan(&most); err != nil {
		return fmt.Errorf("poll handover: read the largest %s of the rows poll mode has not published: %w", seq, err)
	}
	if most == nil {
		return nil
	}
	grace := 3 * r.cfg.LeaseTTL
	// Light on the primary: whether any is left, every second; how many,
	// only when said.
	exists := fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE %s IS NULL AND %s <= $1)", tbl, poll.Published, col)
	count := fmt.Sprintf("SELECT count(*) FROM %s WHERE %s IS NULL AND %s <= $1", tbl, poll.Published, col)
	var said, alone time.Time
	for {
		var pending bool
		if err := conn.QueryRow(ctx, exists, *most).Scan(&pending); err != nil {
			return fmt.Errorf("poll handover: look for rows poll mode has still to publish: %w", err)
		}
		if !pending {
			if !said.IsZero() {
				r.lastErr.Store(nil)
			}
			r.log.Info("poll handover: poll mode has published every row written before the slot; streaming now. Stop the poll relays (README, switching relays)", "table", tbl)
			return nil
		}
		readers, err := poll.Readers(ctx, conn, r.schema, r.table)
		if err != nil {
			return err
		}
		switch {
		case readers > 0:
			alone = time.Time{}
		case alone.IsZero():
			alone = time.Now()
		case time.Since(alone) > grace:
			return fatal.Errorf("poll handover: rows of %s written before the slot %q are not published and no poll relay has run for %s: the slot does not carry them. Start the poll relays again until the WAL relay says it streams (README, switching relays); or drop the slot (SELECT pg_drop_replication_slot('%s')) and start once with OUTBOX_SNAPSHOT=initial, which publishes every row of the table again", tbl, r.cfg.Slot, grace, r.cfg.Slot)
		}
		if said.IsZero() || time.Since(said) > 10*time.Second {
			said = time.Now()
			var left int64
			if err := conn.QueryRow(ctx, count, *most).Scan(&left); err != nil {
				return fmt.Errorf("poll handover: count the rows poll mode has still to publish: %w", err)
			}
			msg := fmt.Sprintf("poll handover: waiting for poll mode to publish %d rows written before the slot (%s up to %d) before streaming, so that no aggregate's later event overtakes an earlier one; %d poll relays running", left, seq, *most, readers)
			r.lastErr.Store(&msg)
			r.log.Warn(msg, "table", tbl)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
