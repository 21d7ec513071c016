package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/route"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// Event is one outbox event read from the WAL, handed to the producer. When
// Err is set the event is poison (a malformed table-less message) and must be
// dead-lettered with Row holding what was read.
type Event struct {
	Txn *tracker.Txn
	Row *route.Row
	Err error
}

// Counters the stream reports; the relay turns them into metrics.
type Counters struct {
	// Ignored counts changes that are not outbox inserts, by kind
	// (update, delete, truncate, other-table).
	Ignored func(kind string)
	// Refused counts non-transactional outbox messages (never published).
	Refused func()
	// Status counts status updates sent.
	Status func()
	// Message is told of every event written as a logical decoding
	// message, before it is handed on (checkpoint.Writer.SawMessage).
	Message func()
	// Silent counts streams ended because the server went silent
	// (ErrSilent).
	Silent func()
}

// Confirmer is what a Stream asks before it confirms a position: the
// newest position that may be confirmed now (the connector's checkpoint
// owns the answer).
type Confirmer interface{ Confirmable() uint64 }

// ConfirmFunc is a Confirmer of a function (tests, benchmarks).
type ConfirmFunc func() uint64

// Confirmable calls f.
func (f ConfirmFunc) Confirmable() uint64 { return f() }

// Stream reads the slot with pgoutput and hands outbox events to Out. One
// goroutine (the one calling Run and then Finish) owns the replication
// connection: nothing else writes to it (go-pq-cdc #142).
type Stream struct {
	Conn        *pgconn.PgConn
	Slot        string
	Publication string
	Schema      string
	Table       string
	// Messages asks pgoutput for logical decoding messages (PostgreSQL 14+).
	Messages bool
	// RecoverLoss makes a slot that is missing or invalidated a failure of
	// the session, not of the connector: the next session recovers it
	// (OUTBOX_ON_SLOT_LOSS=recover).
	RecoverLoss bool
	Tracker     *tracker.Tracker
	Out         chan<- Event
	// Position says what may be confirmed (checkpoint.Writer: acked, and
	// already recorded durably in the state row).
	Position       Confirmer
	StatusInterval time.Duration
	// StopGrace is how long a soft stop waits for the transaction being
	// read to end before abandoning it.
	StopGrace time.Duration
	// SilenceTimeout is how long the stream may hear nothing from the
	// server before it takes the connection for dead and ends with an error
	// wrapping ErrSilent (zero: never). A path that drops everything (a
	// lost NAT entry, a firewall) neither closes nor resets the connection:
	// reads time out and status updates pile up in the kernel, unanswered,
	// until TCP gives up some 15 minutes later, while the lease, on a
	// connection of its own, keeps any standby away. An idle walsender
	// sends nothing while our status updates keep arriving (it pings only
	// a client that has not replied for half its wal_sender_timeout), so
	// silence alone proves nothing: a quarter of the way in the stream asks
	// for a reply (a status update with ReplyRequested), which a healthy
	// walsender answers with a keepalive at once when idle, and within half
	// its wal_sender_timeout while it decodes a large transaction (it reads
	// its input that often then, in WalSndUpdateProgress: seen on 13.23 and
	// 15, a decode of 4 s with a 1 s timeout). Time spent not reading
	// (waiting for the producer, Finish) is not silence. Writes to the
	// connection are bounded by the same clock, so that a send buffer the
	// path no longer drains cannot block the stream (or its end) instead.
	SilenceTimeout time.Duration
	// Busy, asked when the stream has heard nothing for SilenceTimeout, says
	// from another connection whether the walsender is busy rather than
	// cut off: on PostgreSQL 13 to 15 it reads nothing from the client
	// while it replays a committed transaction none of whose changes reach
	// the output plugin (a table rewrite: ALTER TABLE ... TYPE on any table
	// of the database), so the probe goes unanswered for as long, and the
	// same replay after every reconnect made a silence that never ended.
	// Busy: the silence clock starts again. An error, or nil Busy: silent.
	Busy func(context.Context) (bool, error)
	// Abort, when done, stops Run at once, without the grace: the leader
	// lost its lease and must publish nothing more.
	Abort    context.Context
	Log      *slog.Logger
	Counters Counters
	// Faults, set by tests only, fails or stops the stream at a step.
	Faults fault.Hook
	// IsOutboxPartition reports whether the relation with this OID is a
	// partition of the outbox table, at any depth (OutboxPartitionOf). A
	// publication that publishes the outbox's partitions under their own
	// names (publish_via_partition_root off, or a partition listed itself)
	// sends the outbox's rows as a partition's: counted as another table's,
	// they would be confirmed unpublished, so the stream stops instead. It
	// is asked at the first insert into a relation that is not the outbox,
	// once per Relation message. Nil: never asked, every other relation is
	// another table.
	IsOutboxPartition func(ctx context.Context, relID uint32) (bool, error)
	// OutboxColumns returns the columns of the outbox table when it is
	// partitioned, none when it is not (OutboxColumnsOf). The catalog that
	// IsOutboxPartition reads is today's: a partition detached or dropped
	// after the insert was written is no partition of the outbox any more,
	// and its inserts would be counted as another table's, confirmed
	// unpublished. So a relation that is not a partition of the outbox now
	// but has the partitioned outbox's routing columns stops the stream too
	// (fail closed: it may be another table with the outbox's columns, and
	// the error says what to do then). Asked after IsOutboxPartition said
	// no, once per Relation message. Nil: never asked.
	OutboxColumns func(ctx context.Context) ([]RelationColumn, error)
	// RoutingColumns are the columns a relation must have to be taken for
	// a former partition when OutboxColumns gives some (RoutingColumns of
	// the router's configuration): the outbox's columns may have changed
	// since the insert was written, so its exact column set is not asked.
	// Nil: those of route.DefaultConfig.
	RoutingColumns []string
	// ColumnInfo reads what the catalog says of a relation's columns (NOT
	// NULL, defaults: ColumnInfoOf), once per Relation message, before
	// its first insert is handed on; the rows carry it (route.Column.Info)
	// so that their schemas are Debezium's. Nil: never asked.
	ColumnInfo func(ctx context.Context, relID uint32) (map[string]*route.ColumnInfo, error)

	rels map[uint32]*relation
	cols []TupleColumn
	// standbyWarned is when the walsender's last warning that logical
	// decoding waits for a standby (synchronized_standby_slots) was logged.
	standbyWarned time.Time
	txn           *tracker.Txn
	begin         Begin
	walEnd        uint64 // newest server WAL end seen (keepalives and data)
	lastCommitEnd uint64
	nextStatus    time.Time
	sentFlush     uint64
	// heard is when the stream last heard from the server, or last went
	// back to reading after a pause; probed says whether a reply was asked
	// for since (see SilenceTimeout).
	heard  time.Time
	probed bool
	// readDeadline is the deadline last set on the connection: setting it
	// costs a timer update per call, so it is set only when it changes.
	readDeadline time.Time
	// table is Schema.Table, built once rather than per event.
	table string
}

type relation struct {
	*Relation
	outbox bool
	// checked says whether IsOutboxPartition (and OutboxColumns) were
	// asked; partition is the first's answer, lookalike whether a relation
	// that is not a partition has the outbox's routing columns.
	checked, partition, lookalike bool
	// info is ColumnInfo's answer by column, once infoRead.
	info     []*route.ColumnInfo
	infoRead bool
}

var outboxPrefix = []byte("outbox")

// Run starts replication at start and streams until ctx is done (it then
// returns nil, having stopped reading: call Finish) or the stream fails.
func (s *Stream) Run(ctx context.Context, start uint64) error {
	args := []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", s.Publication)}
	if s.Messages {
		args = append(args, "messages 'true'")
	}
	// START_REPLICATION is not interrupted by a soft stop: a stop that
	// arrives while it runs is handled by the loop below, once the copy
	// stream is open, so that Finish can end it cleanly. It is bounded on
	// its own (and by an abort).
	startCtx, cancelStart := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	if s.Abort != nil {
		stopStart := context.AfterFunc(s.Abort, cancelStart)
		defer stopStart()
	}
	err := pglogrepl.StartReplication(startCtx, s.Conn, s.Slot, pglogrepl.LSN(start), pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: args,
	})
	cancelStart()
	if err != nil {
		return s.classifyStart(start, err)
	}
	s.rels = make(map[uint32]*relation)
	s.readDeadline = time.Time{}
	s.walEnd = start
	s.sentFlush = 0
	s.nextStatus = time.Now()
	s.heard, s.probed = s.nextStatus, false
	// A soft stop (ctx done) lets the transaction being read finish, for up
	// to StopGrace, so that a graceful stop confirms whole transactions and
	// a restart repeats nothing. emitCtx ends when the grace does.
	emitCtx, cancelEmit := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelEmit()
	var graceEnd time.Time
	stop := context.AfterFunc(ctx, func() {
		time.AfterFunc(s.StopGrace, cancelEmit)
		// A blocked read is interrupted at once; the read deadline is the
		// only thing touched from another goroutine, and net.Conn allows it.
		_ = s.Conn.Conn().SetReadDeadline(time.Now())
	})
	defer stop()
	if s.Abort != nil {
		defer context.AfterFunc(s.Abort, func() {
			cancelEmit()
			_ = s.Conn.Conn().SetReadDeadline(time.Now())
		})()
	}
	for {
		if s.Abort != nil && s.Abort.Err() != nil {
			return nil
		}
		now := time.Now()
		if ctx.Err() != nil {
			if s.txn == nil {
				return nil
			}
			if graceEnd.IsZero() {
				graceEnd = now.Add(s.StopGrace)
			}
			if !now.Before(graceEnd) || emitCtx.Err() != nil {
				return nil
			}
		}
		if s.SilenceTimeout > 0 && now.Sub(s.heard) >= s.SilenceTimeout {
			if !s.busy(ctx) {
				return s.wentSilent(now)
			}
			s.heard, s.probed = now, false
		}
		probe := s.SilenceTimeout > 0 && !s.probed && !now.Before(s.heard.Add(s.SilenceTimeout/4))
		if probe || !now.Before(s.nextStatus) {
			if err := s.sendStatus(probe); err != nil {
				return err
			}
			s.probed = s.probed || probe
		}
		deadline := s.nextStatus
		if !graceEnd.IsZero() && graceEnd.Before(deadline) {
			deadline = graceEnd
		}
		if s.SilenceTimeout > 0 {
			// The next look at the silence: the probe, or the end.
			at := s.heard.Add(s.SilenceTimeout)
			if !s.probed {
				at = s.heard.Add(s.SilenceTimeout / 4)
			}
			if at.Before(deadline) {
				deadline = at
			}
		}
		// A stop sets the deadline from another goroutine: while stopping,
		// and after any timeout, set it again rather than trust the cache.
		if ctx.Err() != nil || !deadline.Equal(s.readDeadline) {
			_ = s.Conn.Conn().SetReadDeadline(deadline)
			s.readDeadline = deadline
		}
		msg, err := s.Conn.ReceiveMessage(context.Background())
		if err != nil {
			if isTimeout(err) {
				s.readDeadline = time.Time{}
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receive from slot %q: %w", s.Slot, err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(emitCtx, m.Data); err != nil {
				if emitCtx.Err() != nil {
					return nil
				}
				return err
			}
		case *pgproto3.ErrorResponse:
			return s.classifyStream(pgconn.ErrorResponseToPgError(m))
		case *pgproto3.NoticeResponse:
			if err := s.notice(m); err != nil {
				return err
			}
		case *pgproto3.CopyDone:
			return fmt.Errorf("server ended the replication stream of slot %q", s.Slot)
		}
		// After handling it: time spent there (a catalog lookup, waiting
		// for the producer) is not the server's silence.
		s.heard, s.probed = time.Now(), false
	}
}

// ErrSilent is what errors.Is finds in the error of a stream that heard
// nothing from the server for its SilenceTimeout, not even the answer to a
// status update that asked for one. It is no fatal error: the session ends
// and the connector reconnects.
var ErrSilent = errors.New("the replication connection went silent")

type silentError struct {
	slot   string
	silent time.Duration
	probed bool
}

func (e *silentError) Error() string {
	asked := ""
	if e.probed {
		asked = ", not even an answer to a status update that asked for one"
	}
	return fmt.Sprintf("no message from the server for %s on slot %q%s: the network path may be silent; reconnecting", e.silent.Round(time.Millisecond), e.slot, asked)
}

func (e *silentError) Is(target error) bool { return target == ErrSilent }

// busy asks Busy, within a bound, whether the walsender is busy decoding.
func (s *Stream) busy(ctx context.Context) bool {
	if s.Busy == nil {
		return false
	}
	// Not ended by a soft stop: within its grace the stream still reads,
	// and a walsender busy then is not a silent path either.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(s.SilenceTimeout/2, 5*time.Second))
	defer cancel()
	busy, err := s.Busy(bctx)
	if err != nil {
		s.Log.Warn("could not ask whether the walsender is busy; taking the silence for a silent path", "slot", s.Slot, "err", err)
		return false
	}
	if busy {
		s.Log.Info("the server sent nothing for the silence timeout, but its walsender is busy (decoding a transaction whose changes are not published, such as a table rewrite); waiting again", "slot", s.Slot, "timeout", s.SilenceTimeout)
	}
	return busy
}

// wentSilent counts a silent end and returns its error. Every later read
// or write of the connection fails at once from here on: the session then
// closes it, and its goodbye must not wait on a path that takes nothing.
func (s *Stream) wentSilent(now time.Time) error {
	_ = s.Conn.Conn().SetDeadline(now)
	if s.Counters.Silent != nil {
		s.Counters.Silent()
	}
	return &silentError{slot: s.Slot, silent: now.Sub(s.heard), probed: s.probed}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || pgconn.Timeout(err)
}

func (s *Stream) handleCopyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty CopyData", ErrMalformed)
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := decodeKeepalive(data[1:])
		if err != nil {
			return err
		}
		if ka.WALEnd > s.walEnd {
			s.walEnd = ka.WALEnd
		}
		// Between Begin and Commit the tracker has an open transaction, so
		// this cannot ack past it.
		s.Tracker.ServerWALEnd(ka.WALEnd)
		if ka.ReplyRequested {
			s.heard = time.Now()
			return s.sendStatus(false)
		}
		return nil
	case pglogrepl.XLogDataByteID:
		x, err := decodeXLogData(data[1:])
		if err != nil {
			return err
		}
		if x.WALEnd > s.walEnd {
			s.walEnd = x.WALEnd
		}
		return s.handleMessage(ctx, x.WALStart, x.Data)
	default:
		return nil
	}
}

func (s *Stream) handleMessage(ctx context.Context, lsn uint64, b []byte) error {
	body := b[1:]
	switch b[0] {
	case msgBegin:
		m, err := decodeBegin(body)
		if err != nil {
			return err
		}
		if s.txn != nil {
			return fmt.Errorf("%w: begin inside an open transaction", ErrMalformed)
		}
		s.begin = m
		s.txn = s.Tracker.Begin(m.FinalLSN)
	case msgCommit:
		m, err := decodeCommit(body)
		if err != nil {
			return err
		}
		if s.txn == nil {
			return fmt.Errorf("%w: commit without begin", ErrMalformed)
		}
		s.txn.Commit(m.EndLSN)
		s.txn = nil
		s.lastCommitEnd = m.EndLSN
		// Status updates go out on time even while data flows.
		if now := time.Now(); !now.Before(s.nextStatus) {
			s.heard = now
			return s.sendStatus(false)
		}
	case msgRelation:
		rel, err := decodeRelation(body)
		if err != nil {
			return err
		}
		s.rels[rel.ID] = &relation{Relation: rel, outbox: rel.Namespace == s.Schema && rel.Name == s.Table}
	case msgInsert:
		relID, cols, err := decodeInsert(body, s.cols)
		s.cols = cols
		if err != nil {
			return err
		}
		rel := s.rels[relID]
		if rel == nil {
			return fmt.Errorf("%w: insert for relation %d before its relation message", ErrMalformed, relID)
		}
		if !rel.outbox {
			// With publish_via_partition_root pgoutput sends a partition's
			// Relation message too, but names the outbox in the insert:
			// only an insert tells what the publication does.
			if err := s.refusePartition(ctx, rel); err != nil {
				return err
			}
			s.count("other-table")
			return nil
		}
		if s.txn == nil {
			return fmt.Errorf("%w: insert outside a transaction", ErrMalformed)
		}
		if err := s.columnInfo(ctx, rel); err != nil {
			return err
		}
		row, err := s.row(rel, cols, lsn)
		if err != nil {
			return err
		}
		return s.emit(ctx, Event{Txn: s.txn, Row: row})
	case msgUpdate:
		s.count("update")
	case msgDelete:
		s.count("delete")
	case msgTruncate:
		s.count("truncate")
	case msgMessage:
		m, err := decodeMessage(body)
		if err != nil {
			return err
		}
		if !bytes.Equal(m.Prefix, outboxPrefix) {
			s.count("message-other-prefix")
			return nil
		}
		if !m.Transactional || s.txn == nil {
			// Delivered even when its transaction rolls back: publishing it
			// could emit a phantom event.
			s.Log.Warn("refused a non-transactional logical message with prefix outbox; use pg_logical_emit_message(true, 'outbox', ...)",
				"lsn", FormatLSN(m.LSN))
			if s.Counters.Refused != nil {
				s.Counters.Refused()
			}
			return nil
		}
		src := s.source(m.LSN)
		src.Message = true
		if s.Counters.Message != nil {
			s.Counters.Message()
		}
		row, rerr := route.RowFromMessage(m.Content, src)
		if rerr != nil {
			content := append([]byte(nil), m.Content...)
			row = &route.Row{Source: src, Columns: []route.Column{{Name: "content", Type: route.OIDText, Value: content}}}
			return s.emit(ctx, Event{Txn: s.txn, Row: row, Err: rerr})
		}
		return s.emit(ctx, Event{Txn: s.txn, Row: row})
	case msgOrigin, msgType:
	default:
		return fmt.Errorf("%w: unknown pgoutput message type %q", ErrMalformed, b[0])
	}
	return nil
}

// refusePartition returns a fatal.Error for an insert into a partition of
// the outbox (see IsOutboxPartition), or into a relation that may have been
// one (see OutboxColumns). It returns before the insert is handed on and
// with its transaction still open: the tracker acks nothing from that
// transaction on, so nothing of it or after it is confirmed, and the next
// start reads it again.
func (s *Stream) refusePartition(ctx context.Context, rel *relation) error {
	if s.IsOutboxPartition == nil {
		return nil
	}
	if !rel.checked {
		is, err := s.IsOutboxPartition(ctx, rel.ID)
		if err != nil {
			return fmt.Errorf("find whether %s.%s, which an insert of slot %q names, is a partition of %s.%s: %w", rel.Namespace, rel.Name, s.Slot, s.Schema, s.Table, err)
		}
		lookalike := false
		if !is && s.OutboxColumns != nil {
			cols, err := s.OutboxColumns(ctx)
			if err != nil {
				return fmt.Errorf("find whether %s.%s, which an insert of slot %q names, was a partition of %s.%s: %w", rel.Namespace, rel.Name, s.Slot, s.Schema, s.Table, err)
			}
			routing := s.RoutingColumns
			if routing == nil {
				routing = RoutingColumns(route.DefaultConfig())
			}
			lookalike = len(cols) > 0 && hasColumns(rel.Columns, routing)
		}
		rel.checked, rel.partition, rel.lookalike = true, is, lookalike
	}
	if rel.lookalike {
		return fatal.Errorf("slot %q sent an insert into %s.%s (relation %d; transaction committed at %s), which is not a partition of the partitioned outbox table %s.%s now but has the columns the connector reads from it: "+
			"a partition of the outbox detached or dropped after the insert was written, while publication %q published the outbox's partitions as themselves (publish_via_partition_root off), or another table with the outbox's columns that the publication publishes. "+
			"The connector stopped before confirming that transaction rather than skip what may be outbox events. "+
			"If it was a partition: run ALTER PUBLICATION %s SET (publish_via_partition_root = true); PostgreSQL decodes each transaction with the publication as it was when the transaction was written, so a transaction written before the fix stops the connector again; "+
			"its events are in %s.%s if the partition was detached, and only in the slot if it was dropped. "+
			"If it is another table: publish only the outbox in %q (ALTER PUBLICATION %s SET TABLE %s;), or give the connector a publication of its own (OUTBOX_PUBLICATION)",
			s.Slot, rel.Namespace, rel.Name, rel.ID, FormatLSN(s.begin.FinalLSN), s.Schema, s.Table, s.Publication, s.Publication, rel.Namespace, rel.Name,
			s.Publication, s.Publication, pgx.Identifier{s.Schema, s.Table}.Sanitize())
	}
	if !rel.partition {
		return nil
	}
	return fatal.Errorf("slot %q sent an insert into %s.%s, a partition of the outbox table %s.%s, under the partition's own name (transaction committed at %s): "+
		"publication %q publishes the outbox's partitions as themselves (publish_via_partition_root is off, or it lists a partition). "+
		"The connector stopped before confirming that transaction. Run: ALTER PUBLICATION %s SET (publish_via_partition_root = true); and make sure it lists %s itself. "+
		"PostgreSQL decodes each transaction with the publication as it was when the transaction was written, so a transaction written before the fix stops the connector again; "+
		"its events are still in the outbox table",
		s.Slot, rel.Namespace, rel.Name, s.Schema, s.Table, FormatLSN(s.begin.FinalLSN), s.Publication, s.Publication, pgx.Identifier{s.Schema, s.Table}.Sanitize())
}

func (s *Stream) count(kind string) {
	if s.Counters.Ignored != nil {
		s.Counters.Ignored(kind)
	}
}

func (s *Stream) source(lsn uint64) route.Source {
	if s.table == "" {
		s.table = s.Schema + "." + s.Table
	}
	return route.Source{LSN: lsn, CommitLSN: s.begin.FinalLSN, CommitTime: s.begin.CommitTime, Table: s.table}
}

// smallRow is the most columns a row allocated with its columns has.
const smallRow = 8

type rowWithColumns struct {
	row  route.Row
	cols [smallRow]route.Column
}

// row copies a tuple out of the connection's buffer (reused by the next
// read) into one allocation.
func (s *Stream) row(rel *relation, cols []TupleColumn, lsn uint64) (*route.Row, error) {
	if len(cols) != len(rel.Columns) {
		return nil, fmt.Errorf("%w: insert has %d columns, relation %s.%s has %d", ErrMalformed, len(cols), rel.Namespace, rel.Name, len(rel.Columns))
	}
	n := 0
	for _, c := range cols {
		n += len(c.Data)
	}
	buf := make([]byte, 0, n)
	var row *route.Row
	if len(cols) <= smallRow {
		// The row and its columns in one allocation: the usual outbox
		// table has fewer columns than this.
		r := &rowWithColumns{}
		r.row.Columns = r.cols[:len(cols):len(cols)]
		row = &r.row
	} else {
		row = &route.Row{Columns: make([]route.Column, len(cols))}
	}
	row.Source = s.source(lsn)
	for i, c := range cols {
		rc := &row.Columns[i]
		rc.Name = rel.Columns[i].Name
		rc.Type = rel.Columns[i].Type
		rc.TypeMod, rc.HasTypeMod = rel.Columns[i].TypeMod, true
		if rel.info != nil {
			rc.Info = rel.info[i]
		}
		switch c.Kind {
		case 'n', 'u':
			rc.Null = true
		default:
			start := len(buf)
			buf = append(buf, c.Data...)
			rc.Value = buf[start:len(buf):len(buf)]
		}
	}
	return row, nil
}

// emit hands an event to the producer. While the producer is full the
// stream stops reading but keeps sending status updates, so the walsender
// does not time out (rule 6).
func (s *Stream) emit(ctx context.Context, ev Event) error {
	ev.Txn.Add()
	select {
	case s.Out <- ev:
		return nil
	default:
	}
	for {
		wait := time.Until(s.nextStatus)
		if wait < 0 {
			wait = 0
		}
		t := time.NewTimer(wait)
		select {
		case s.Out <- ev:
			t.Stop()
			return nil
		case <-t.C:
			// Not reading meanwhile: the silence clock holds (and the
			// status update's write is bounded from now).
			s.heard = time.Now()
			if err := s.sendStatus(false); err != nil {
				ev.Txn.Abandon()
				return err
			}
		case <-ctx.Done():
			t.Stop()
			ev.Txn.Abandon()
			return ctx.Err()
		}
	}
}

// sendStatus reports the confirmable position as flushed. The write
// position is the newest WAL end seen, so the walsender does not keep
// sending keepalives for WAL we already know about. reply asks the server
// to answer at once (a keepalive). With a SilenceTimeout the write must be
// done when the silence would end the stream: a send buffer the path no
// longer drains is that silence too.
func (s *Stream) sendStatus(reply bool) error {
	if err := s.Faults.At(fault.BeforeStatus); err != nil {
		return err
	}
	flush := s.Position.Confirmable()
	if flush > s.walEnd {
		flush = s.walEnd
	}
	if flush < s.sentFlush {
		flush = s.sentFlush
	}
	if s.SilenceTimeout > 0 {
		_ = s.Conn.Conn().SetWriteDeadline(s.heard.Add(s.SilenceTimeout))
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.Conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(s.walEnd),
		WALFlushPosition: pglogrepl.LSN(flush),
		WALApplyPosition: pglogrepl.LSN(flush),
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		if s.SilenceTimeout > 0 && isTimeout(err) {
			return s.wentSilent(time.Now())
		}
		return fmt.Errorf("send status update to slot %q: %w", s.Slot, err)
	}
	s.sentFlush = flush
	s.nextStatus = time.Now().Add(s.StatusInterval)
	if s.Counters.Status != nil {
		s.Counters.Status()
	}
	return s.Faults.At(fault.AfterStatus)
}

// SentFlush is the last position reported to the server as flushed.
func (s *Stream) SentFlush() uint64 { return s.sentFlush }

// Finish ends a stream whose Run returned because its ctx was cancelled:
// it waits (until ctx is done) for every committed transaction to be acked,
// lets persist record the final position durably, sends it, and ends the copy
// stream, waiting for the server's answer so that the position is known to
// have arrived (go-pq-cdc #148). Its writes, and the wait for that answer,
// are bounded by the SilenceTimeout too: on a path gone silent the stop
// must not hang on a send buffer nothing drains.
func (s *Stream) Finish(ctx context.Context, persist func(context.Context) uint64) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Second)
	}
	for s.Tracker.Acked() < s.lastCommitEnd && ctx.Err() == nil {
		select {
		case <-s.Tracker.Changed():
		case <-time.After(time.Until(s.nextStatus)):
		case <-ctx.Done():
		}
		if now := time.Now(); !now.Before(s.nextStatus) {
			// Not reading: each write is bounded from now.
			s.heard = now
			if err := s.sendStatus(false); err != nil {
				return err
			}
		}
	}
	if persist != nil {
		persist(ctx)
	}
	s.heard = time.Now()
	if err := s.sendStatus(false); err != nil {
		return err
	}
	if s.SilenceTimeout > 0 {
		if d := s.heard.Add(s.SilenceTimeout); d.Before(deadline) {
			deadline = d
		}
	}
	// SendStandbyCopyDone takes no context: the deadline bounds its write
	// and its wait for the answer.
	_ = s.Conn.Conn().SetDeadline(deadline)
	defer func() { _ = s.Conn.Conn().SetDeadline(time.Time{}) }()
	if _, err := pglogrepl.SendStandbyCopyDone(ctx, s.Conn); err != nil {
		return fmt.Errorf("end the replication stream of slot %q: %w", s.Slot, err)
	}
	return nil
}

// classifyStart turns START_REPLICATION errors into fatal ones where the
// operator must act.
func (s *Stream) classifyStart(start uint64, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42704": // undefined_object: slot or publication missing
			if bytes.Contains([]byte(pgErr.Message), []byte("publication")) {
				return s.missingPublication(start, err)
			}
			if s.RecoverLoss {
				return fmt.Errorf("replication slot %q does not exist (dropped while the connector ran?); the next session recovers it: %w", s.Slot, err)
			}
			return &fatal.Error{Msg: fmt.Sprintf("replication slot %q does not exist (dropped while the connector ran?): events may have been skipped; see OUTBOX_ACCEPT_SLOT_RESET in the README", s.Slot), Err: err}
		case "55000": // object_not_in_prerequisite_state: invalidated slot
			if s.RecoverLoss {
				return fmt.Errorf("replication slot %q cannot be streamed (invalidated?); the next session recovers it if it is lost: %w", s.Slot, err)
			}
			return &fatal.Error{Msg: fmt.Sprintf("replication slot %q cannot be streamed (invalidated?): events were skipped; drop it and restart to take a new snapshot", s.Slot), Err: err}
		}
	}
	return s.classifyStream(err)
}

// classifyStream turns an error of the running stream into a fatal one where
// retrying cannot help: an invalidated slot (55000), and a publication that
// did not exist when the change being decoded was written (42704: pgoutput
// looks it up with the catalog as of that change, so every session fails at
// the same change, forever, with nothing in flight). The message is not
// read: it is in the server's lc_messages (`Publikation »outbox_pub«
// existiert nicht`), which the connector cannot choose. Any 42704 once the
// stream runs is taken for the publication: a missing slot fails
// START_REPLICATION (classifyStart), and an active slot cannot be dropped.
func (s *Stream) classifyStream(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "55000":
			if s.RecoverLoss {
				return fmt.Errorf("stream slot %q (the next session recovers it if it is lost): %w", s.Slot, err)
			}
			return &fatal.Error{Msg: fmt.Sprintf("slot %q: %s", s.Slot, pgErr.Message), Err: err}
		case "42704":
			return s.missingPublication(s.Tracker.Acked(), err)
		}
	}
	return fmt.Errorf("stream slot %q: %w", s.Slot, err)
}

// notice stops the stream at PostgreSQL 18's warning that it skipped the
// publication (`skipped loading publication "outbox_pub"`, "The publication
// does not exist at this point in the WAL"): from 18 on, pgoutput decodes a
// change written while the publication was missing as if it published
// nothing, where 13 to 17 fail with 42704, and the keepalive after it would
// confirm past it. The warning comes before that keepalive on the stream,
// so nothing of it is confirmed. The message may be translated, quotes
// included (`»outbox_pub«`, `« outbox_pub »`); the unlocalized severity, the
// code (55000 in 18) and the bare publication name are kept. So a warning
// with that code or 42704 (undefined_object, should a later release change
// it), or naming the publication, stops the stream: fail closed, since a
// stop is loud and a skip is silent.
//
// PostgreSQL 17's walsender also warns with 55000 (or 22023) while a slot
// named in synchronized_standby_slots is missing, inactive or invalidated:
// decoding waits for that standby. The parameter's name is an argument of
// the message, never translated: such a warning is logged (once a minute)
// and the stream goes on (it is the stall detector's, if it lasts).
func (s *Stream) notice(m *pgproto3.NoticeResponse) error {
	if m.SeverityUnlocalized != "WARNING" {
		return nil
	}
	// 18's skipped-publication warning never names the parameter; the
	// standby's slot name may contain the publication's, so that is not
	// looked at here.
	if strings.Contains(m.Message, "synchronized_standby_slots") {
		if s.Log != nil && time.Since(s.standbyWarned) > time.Minute {
			s.standbyWarned = time.Now()
			s.Log.Warn("PostgreSQL holds logical decoding back until a standby named in synchronized_standby_slots has the WAL: events wait until it does",
				"server", m.Message, "detail", m.Detail, "hint", m.Hint)
		}
		return nil
	}
	if m.Code != "55000" && m.Code != "42704" && !strings.Contains(m.Message, s.Publication) {
		return nil
	}
	n := pgconn.PgError{Severity: m.Severity, SeverityUnlocalized: m.SeverityUnlocalized, Code: m.Code, Message: m.Message, Detail: m.Detail, Hint: m.Hint}
	return s.missingPublication(s.Tracker.Acked(), &n)
}

func (s *Stream) missingPublication(after uint64, cause error) error {
	create := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'); for a partitioned outbox WITH (publish = 'insert', publish_via_partition_root = true)",
		pgx.Identifier{s.Publication}.Sanitize(), pgx.Identifier{s.Schema, s.Table}.Sanitize())
	err := missingPublication(s.Slot, s.Publication, after, create)
	var fe *fatal.Error
	if errors.As(err, &fe) {
		fe.Err = cause
	}
	return err
}
