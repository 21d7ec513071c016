package inbox

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// outcome is how one attempt at a record ended.
type outcome int

const (
	applied   outcome = iota + 1 // the handler's work and the processed id committed
	duplicate                    // the id was already processed with this payload: skipped
	reused                       // the id was already processed with another payload: see result.err
	failed                       // see result.err and result.fault
)

// result is the end of one attempt.
type result struct {
	outcome outcome
	fault   fault // when failed: whose fault, which decides retry or attempt
	err     error // when failed or reused: why
}

func failure(f fault, err error) result { return result{outcome: failed, fault: f, err: err} }

// handle processes one record to its end (processed, duplicate or
// dead-lettered); it returns an error only when ctx is done, when stop is
// closed (errStopped: the partition was revoked; an attempt in flight is
// finished first, a wait between attempts is not) or when Kafka refuses the
// record's dead letter for good (ErrDeadLetterRefused).
func (c *Consumer) handle(ctx context.Context, stop <-chan struct{}, rec *kgo.Record) error {
	id := Header(rec, "id")
	if err := validateID(id); err != nil {
		// Not even the dead-letter mark can hold this id: dead-letter it
		// unmarked (a redelivery is dead-lettered again).
		return c.deadLetter(ctx, stop, rec, letter{id: id, reason: err})
	}
	hash := payloadHash(rec.Value)
	redrive := redriveFor(rec, id, c.cfg.Group)
	if !redrive && Header(rec, RedriveHeader) == id {
		c.log.Info("a redrive for another consumer group: here the id is deduplicated as usual",
			"id", id, "redrive_group", Header(rec, ConsumerHeader), "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
	}
	backoff := retry.Jittered(c.cfg.RetryBackoff, maxBackoff)
	attempts := 0
	for {
		if err := ended(ctx, stop); err != nil {
			return err
		}
		res := c.try(ctx, rec, id, hash, redrive)
		switch {
		case res.outcome == duplicate:
			c.duplicates.Add(1)
			c.log.Info("duplicate delivery skipped", "id", id, "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
			return nil
		case res.outcome == applied:
			c.processed.Add(1)
			return nil
		case res.outcome == reused:
			// Not marked: the id stays the first payload's.
			c.reused.Add(1)
			return c.deadLetter(ctx, stop, rec, letter{id: id, reason: res.err})
		case res.fault == faultDB:
			c.transient.Add(1)
			c.log.Warn("inbox transaction failed; retrying", "id", id, "topic", rec.Topic, "err", res.err)
		case res.fault == faultDependency:
			c.dependency.Add(1)
			c.log.Warn("the handler reports a transient failure; retrying", "id", id, "topic", rec.Topic, "err", res.err)
		case res.fault == faultDeployment:
			// Error level: this passes only when someone acts, and the
			// partition waits until then.
			c.deployment.Add(1)
			c.log.Error("the database lacks a table, column, function or privilege the statement needs "+
				"(a migration or grant not applied yet?); retrying until it is there, the record is not dead-lettered",
				"id", id, "topic", rec.Topic, "partition", rec.Partition, "sqlstate", sqlState(res.err), "err", res.err)
		default:
			attempts++
			if errors.Is(res.err, ErrPermanent) || attempts >= c.cfg.MaxAttempts {
				return c.deadLetter(ctx, stop, rec, letter{id: id, hash: hash, mark: true, reason: res.err, attempts: attempts})
			}
			c.retries.Add(1)
			c.log.Warn("record failed; retrying", "id", id, "topic", rec.Topic, "attempt", attempts, "err", res.err)
		}
		sleepOr(ctx, stop, backoff.NextBackOff())
	}
}

const (
	insertSQL = `INSERT INTO %s (consumer, id, topic, kafka_partition, kafka_offset, outcome, payload_sha256)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (consumer, id) DO NOTHING`
	// In READ COMMITTED this statement sees the row that made the INSERT
	// do nothing, also when it was committed by a concurrent transaction
	// the INSERT waited for.
	selectSQL = `SELECT outcome, payload_sha256, redriven_sha256 FROM %s WHERE consumer = $1 AND id = $2`
	// Takes a dead-lettered id back for a redrive. The row lock it holds
	// until the transaction ends makes a concurrent copy of the redrive
	// wait; that copy's WHERE then finds the outcome changed and updates
	// nothing (and the next attempt sees a processed id: a duplicate). The
	// original payload's hash stays: a late copy of the original event is
	// a duplicate too, not another event reusing the id.
	redriveSQL = `UPDATE %s SET outcome = 'processed', topic = $3, kafka_partition = $4, kafka_offset = $5,
	redriven_sha256 = $6, processed_at = now() WHERE consumer = $1 AND id = $2 AND outcome = 'dead-lettered'`
)

// payloadHash is what the table keeps of a record's payload (its value) to
// tell a duplicate from another event reusing the id. Headers are left out:
// a relay that republishes an event changes some (the lease token).
func payloadHash(value []byte) []byte {
	h := sha256.Sum256(value)
	return h[:]
}

// beginSQL starts an attempt's transaction (one round trip: BeginQuery goes
// by the simple protocol, which takes several statements) with a
// lock_timeout of %[1]d ms, a third of TxTimeout, unless the session already
// has a lower one (the role's, the database's, the pool's). A lock wait is
// never the record's fault, but the TxTimeout cut cannot tell it from a hung
// handler and counts an attempt: this way a wait for a lock held longer
// fails first, with 55P03, which is transient, and the record is retried
// without limit instead of dead-lettered. A third, not more: each lock
// acquisition has its own lock_timeout, and a row lock others wait for too
// takes two (the tuple's, behind the waiter ahead, then the holder's
// transaction), which must end before TxTimeout with time for the rest of
// the attempt. A higher lock_timeout is lowered: at or above TxTimeout it
// could never fire first. The handler may set its own (SET LOCAL) for the
// rest of the transaction. Setting it server-side also ends the wait on the
// server: a cut only makes pgx cancel and close the connection.
const beginSQL = `BEGIN; SELECT set_config('lock_timeout', '%[1]dms', true)
WHERE current_setting('lock_timeout')::interval NOT BETWEEN interval '1 microsecond' AND interval '%[1]d milliseconds'`

// lockTimeout is the lock_timeout beginSQL sets for a TxTimeout.
func lockTimeout(txTimeout time.Duration) time.Duration {
	return max(time.Millisecond, (txTimeout / 3).Truncate(time.Millisecond))
}

// try runs one attempt in one transaction, which has TxTimeout to end.
func (c *Consumer) try(parent context.Context, rec *kgo.Record, id string, hash []byte, redrive bool) result {
	ctx, cancel := context.WithTimeout(parent, c.cfg.TxTimeout)
	defer cancel()
	tx, err := c.db.BeginTx(ctx, pgx.TxOptions{BeginQuery: c.begin})
	if err != nil {
		return failure(faultDB, fmt.Errorf("begin: %w", err))
	}
	defer rollback(ctx, tx)
	// A concurrent transaction inserting the same id (another member after
	// a rebalance) makes this INSERT wait for it; if it commits, this one
	// inserts nothing and the record is a duplicate.
	tag, err := tx.Exec(ctx, fmt.Sprintf(insertSQL, c.table), c.cfg.Group, id, rec.Topic, rec.Partition, rec.Offset, "processed", hash)
	if err != nil {
		return failure(classifyDedupe(err), fmt.Errorf("insert processed id: %w", err))
	}
	if tag.RowsAffected() == 0 {
		if res, again := c.seen(ctx, tx, rec, id, hash, redrive); !again {
			return res
		}
	}
	herr := c.call(ctx, tx, rec, id)
	if ctx.Err() != nil && parent.Err() == nil {
		// The deadline cut the handler (whatever it returned: the error
		// of a statement cancelled, or nil after swallowing one). The
		// inbox cannot tell a hung handler from a slow database here, so
		// this counts as an attempt: a database wait that must be retried
		// without limit should fail first with a lock_timeout or
		// statement_timeout below TxTimeout, which are transient.
		return failure(faultRecord, fmt.Errorf("the handler did not finish within TxTimeout (%s), the inbox transaction's deadline: %w",
			c.cfg.TxTimeout, cmp.Or(herr, context.DeadlineExceeded)))
	}
	if herr != nil {
		if tx.Conn().IsClosed() {
			return failure(faultDB, fmt.Errorf("handler: connection lost: %w", herr))
		}
		return failure(classifyHandler(herr), herr)
	}
	if err := tx.Commit(ctx); err != nil {
		// The outcome is unknown if the connection broke during COMMIT;
		// the retry finds the id if it did commit.
		err = fmt.Errorf("commit: %w", err)
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			err = fmt.Errorf("%w (a statement of the handler failed and the handler returned nil)", err)
		}
		return failure(classifyCommit(err), err)
	}
	return result{outcome: applied}
}

// seen says what a record whose id is already in the table is: a redrive
// to apply (again is true: the id is taken back in tx) when the record
// redrives an id that is dead-lettered; otherwise a duplicate when the
// stored payload hash is its own (the first delivery's, or the one a
// redrive applied), or unknown (a row written before the column existed),
// another event reusing the id when it is neither.
func (c *Consumer) seen(ctx context.Context, tx pgx.Tx, rec *kgo.Record, id string, hash []byte, redrive bool) (res result, again bool) {
	var outcome string
	var stored, redriven []byte
	err := tx.QueryRow(ctx, fmt.Sprintf(selectSQL, c.table), c.cfg.Group, id).Scan(&outcome, &stored, &redriven)
	if errors.Is(err, pgx.ErrNoRows) {
		// Deleted between the two statements (Cleanup, an operator): the
		// next attempt inserts it.
		return failure(faultDB, fmt.Errorf("processed id %q vanished while read; retrying", id)), false
	}
	if err != nil {
		return failure(classifyDedupe(err), fmt.Errorf("read processed id: %w", err)), false
	}
	if redrive && outcome == "dead-lettered" {
		// The operator's call: the payload may have been corrected, so it
		// is not compared; its hash is kept beside the original's.
		tag, err := tx.Exec(ctx, fmt.Sprintf(redriveSQL, c.table), c.cfg.Group, id, rec.Topic, rec.Partition, rec.Offset, hash)
		if err != nil {
			return failure(classifyDedupe(err), fmt.Errorf("take back dead-lettered id for a redrive: %w", err)), false
		}
		if tag.RowsAffected() == 0 {
			return failure(faultDB, fmt.Errorf("dead-lettered id %q changed while redriven; retrying", id)), false
		}
		c.redriven.Add(1)
		c.log.Info("redriving a dead letter", "id", id, "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
		return result{}, true
	}
	if stored != nil && !bytes.Equal(stored, hash) && !bytes.Equal(redriven, hash) {
		return result{outcome: reused, err: fmt.Errorf(
			"id %q was already %s with a different payload (sha256 %x, this record's %x): event ids must be unique; not applied",
			id, outcome, stored, hash)}, false
	}
	return result{outcome: duplicate}, false
}

// call runs the handler, turning a panic into an error: a panic is the
// record's fault like any other handler failure (it counts as an attempt and
// dead-letters the record after MaxAttempts) instead of crashing the member,
// which would be redelivered the record and panic again, then the next owner.
func (c *Consumer) call(ctx context.Context, tx pgx.Tx, rec *kgo.Record, id string) (err error) {
	// First deferred, so last to run: the span sees a panic's error too.
	ctx, span := c.startSpan(ctx, rec, id)
	defer func() { endSpan(span, err) }()
	// A handler that ignores ctx cannot be stopped: say so, since the
	// partition (and a rebalance) waits for it.
	watch := time.AfterFunc(c.cfg.TxTimeout+handlerGrace, func() {
		c.log.Error("the handler is still running past TxTimeout: it does not honour its ctx, and its partition waits for it",
			"id", id, "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "tx_timeout", c.cfg.TxTimeout)
	})
	defer watch.Stop()
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("handler panicked", "id", id, "topic", rec.Topic, "partition", rec.Partition,
				"offset", rec.Offset, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return c.h(ctx, tx, rec)
}

// handlerGrace is how long past TxTimeout a handler runs before the
// inbox logs that it ignores its ctx.
const handlerGrace = 5 * time.Second

// rollback ends tx if it is still open (a no-op after Commit), with a
// context of its own so that a done ctx does not leave it to the pool.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(rctx) // an error here closes the connection; the next attempt takes another
}

// ErrDeadLetterRefused is what Run returns (wrapped, with the record and the
// reason) when Kafka refuses a dead letter for good: larger than the DLQ
// topic or the client accepts, or denied by an ACL.
var ErrDeadLetterRefused = errors.New("inbox: dead letter refused")

// dlqRefusals is how many times in a row a dead letter may be refused for
// good (refusedForGood) before Run stops; a backoff apart, so a refusal
// that passes after all (an ACL being granted) is given a few seconds.
const dlqRefusals = 5

// letter is a dead letter to send: the reason and, when mark, the id and
// payload hash to mark dead-lettered in the table (an id the table cannot
// hold, or one another payload already holds, is not marked).
type letter struct {
	id       string
	hash     []byte
	mark     bool
	reason   error
	attempts int
}

// deadLetter sends rec to the DLQ topic with the reason, then marks its id
// dead-lettered (when l.mark), retrying both until they succeed (or ctx is
// done, or stop closed: then the record is left to the next owner), except a
// dead letter Kafka refuses for good: then it returns an error wrapping
// ErrDeadLetterRefused, and Run stops. A crash (or a revoke) between the two
// sends it to the DLQ again on redelivery: at-least-once there too.
func (c *Consumer) deadLetter(ctx context.Context, stop <-chan struct{}, rec *kgo.Record, l letter) error {
	headers := ownHeaders(rec.Headers)
	if l.mark {
		// Republished with this header (the DLQ record as it is, or
		// Redrive's copy), the record is applied once more.
		headers = append(headers, kgo.RecordHeader{Key: RedriveHeader, Value: []byte(l.id)})
	}
	dl := &kgo.Record{
		Topic: c.cfg.DLQTopic, Key: rec.Key, Value: rec.Value,
		Headers: append(headers,
			kgo.RecordHeader{Key: "inbox.error", Value: []byte(l.reason.Error())},
			kgo.RecordHeader{Key: "inbox.attempts", Value: []byte(strconv.Itoa(l.attempts))},
			kgo.RecordHeader{Key: ConsumerHeader, Value: []byte(c.cfg.Group)},
			kgo.RecordHeader{Key: "inbox.source.topic", Value: []byte(rec.Topic)},
			kgo.RecordHeader{Key: "inbox.source.partition", Value: []byte(strconv.Itoa(int(rec.Partition)))},
			kgo.RecordHeader{Key: "inbox.source.offset", Value: []byte(strconv.FormatInt(rec.Offset, 10))},
		),
	}
	backoff := retry.Jittered(c.cfg.RetryBackoff, maxBackoff)
	for refusals := 0; ; {
		// A revoke waits for a try in flight, not for the next: the
		// record is left to the next owner, which dead-letters it again.
		if err := ended(ctx, stop); err != nil {
			return err
		}
		// A fresh record each try: franz-go sets Record.Context to the
		// first Produce's ctx, cancelled once that try returned, and a
		// record produced again with it fails at once ("context
		// canceled"), every try, for ever.
		try := *dl
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := c.cl.ProduceSync(pctx, &try).FirstErr()
		cancel()
		if err == nil {
			break
		}
		// franz-go calls a missing topic retriable, and with auto-creation
		// off it stays missing: create it (it was not at Run's start,
		// Kafka being away then, or it was deleted since), then try again.
		// One that cannot be created is refused for good like the rest.
		missing := false
		if topicMissing(err) {
			if err := ended(ctx, stop); err != nil {
				return err // a revoke does not wait for the topic's creation
			}
			cerr := c.ensureDLQTopic(ctx)
			if cerr == nil {
				c.log.Warn("the DLQ topic was missing; created it (or it exists by now)", "topic", c.cfg.DLQTopic)
			} else {
				missing = true
				err = fmt.Errorf("%w; and it could not be created: %w", err, cerr)
			}
		}
		if !missing && !refusedForGood(err) {
			refusals = 0 // Kafka unreachable or busy: retried without limit
		} else if refusals++; refusals >= dlqRefusals {
			// Neither skip it (marking it would lose the event) nor loop
			// silently: stop the member, aloud. The record is not marked
			// and its offset not committed; the next owner tries again.
			fix := "let the topic take it (max.message.bytes, and the client's kgo.ProducerBatchMaxBytes in KafkaOpts; the producer's ACLs)"
			if missing {
				fix = "the DLQ topic does not exist and the member cannot create it: create it (or grant the member CREATE on it)"
			}
			return fmt.Errorf("%w: the dead letter of %s/%d@%d (id %q) was refused %d times by DLQ topic %q: %w; "+
				"the member stops rather than skip it: %s, then start again",
				ErrDeadLetterRefused, rec.Topic, rec.Partition, rec.Offset, l.id, refusals, c.cfg.DLQTopic, err, fix)
		}
		if missing {
			c.log.Error("the DLQ topic does not exist and cannot be created; retrying, then the member stops",
				"id", l.id, "topic", c.cfg.DLQTopic, "refusals", refusals, "err", err)
		} else {
			c.log.Warn("dead-letter produce failed; retrying", "id", l.id, "topic", c.cfg.DLQTopic, "err", err)
		}
		sleepOr(ctx, stop, backoff.NextBackOff())
	}
	c.deadLettered.Add(1)
	c.log.Error("record dead-lettered", "id", l.id, "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
		"attempts", l.attempts, "dlq", c.cfg.DLQTopic, "err", l.reason)
	if !l.mark {
		return nil
	}
	backoff.Reset()
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A deadline, as every attempt has: a revoke may be waiting.
		mctx, cancel := context.WithTimeout(ctx, c.cfg.TxTimeout)
		_, err := c.db.Exec(mctx, fmt.Sprintf(insertSQL, c.table), c.cfg.Group, l.id, rec.Topic, rec.Partition, rec.Offset, "dead-lettered", l.hash)
		cancel()
		if err == nil {
			return nil
		}
		if classifyDedupe(err) == faultRecord {
			// The table refuses this id for good (validateID let through
			// something the database will not store): the record is in the
			// DLQ, unmarked; a redelivery is dead-lettered again.
			c.log.Error("the dead-lettered id cannot be marked; a redelivery is dead-lettered again", "id", l.id, "err", err)
			return nil
		}
		c.log.Warn("marking a dead-lettered id failed; retrying", "id", l.id, "err", err)
		if err := ended(ctx, stop); err != nil {
			return err
		}
		sleepOr(ctx, stop, backoff.NextBackOff())
	}
}
