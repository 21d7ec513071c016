// Package publish produces routed outbox events to Kafka with franz-go and
// keeps poison events whole: unroutable ones, and ones Kafka refuses for
// their own account (found by producing the suspects of a refused batch
// alone, see poison.go), in the DLQ topic; ones too large for Kafka in the
// outbox_dead_letter table. A record is done for the tracker only once
// Kafka acked it or it was durably dead-lettered. Transactional mode is in
// txn.go, idempotent mode in idem.go.
package publish

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	faultstep "github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"

	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// Config is what the producer needs beyond the client.
type Config struct {
	DLQTopic         string
	MaxMessageBytes  int
	TopicCreate      bool
	TopicPartitions  int32
	TopicReplication int16
	TopicConfigs     map[string]*string
	// Headers are added to every record (the lease token).
	Headers func() []kgo.RecordHeader
	// Published, when set, counts records acked by Kafka.
	Published *atomic.Int64

	// Transactional produces in Kafka transactions (see txn.go); the
	// client must have a transactional id.
	Transactional bool
	// TxnInterval is the longest a transaction stays open.
	TxnInterval time.Duration
	// TxnMaxRecords commits a transaction once it holds this many records.
	TxnMaxRecords int
	// Pipeline, in transactional mode, is a second transactional client
	// of the slot (another transactional id): the two take transactions in
	// turn, so that one commits while the other takes the next events
	// (see txn.go). nil: every commit stops the line.
	Pipeline *kgo.Client
	// Offsets, in transactional mode, writes the exactly-once position
	// into every Kafka transaction and skips the events a position read
	// back at start covers (see exactly.go); nil: neither.
	Offsets *Offsets
	// Poison remembers, across sessions, records that aborted a transaction.
	Poison *Poison
	// Valid, when set, reports whether this instance may still publish (it
	// holds the leader lease); checked before every record, every dead
	// letter and every commit.
	Valid func() bool
	// Faults, set by tests only, fails or stops the producer at a step.
	Faults faultstep.Hook
	// Tracer, when set, gives each record that carries a trace context
	// a span for the relay hop and points its traceparent header at it
	// (see trace.go). nil (no OTLP endpoint configured): no span, no cost.
	Tracer trace.Tracer
	// Blocked, when set, is told what holds the line back while the
	// producer waits for something only an operator can fix (a topic that
	// does not exist with TopicCreate off), and "" once it no longer does;
	// the relay shows it as its last error (/readyz detail).
	Blocked func(reason string)
}

// Producer turns events into records and produces them. One serves one
// session (one Kafka client); Poison carries what it learnt to the next.
type Producer struct {
	cfg     Config
	client  *kgo.Client
	admin   *kadm.Client
	router  *route.Router
	pool    deadLetterDB
	log     *slog.Logger
	metrics *metrics.Metrics

	topics map[string]bool // topics known to exist
	// seen holds the same topics, for watchTopics, which runs on a
	// goroutine of its own: topic -> struct{}.
	seen sync.Map
	// answers counts the promises run (acks and failures alike), so that
	// watchTopics tells records waiting without an answer from a line
	// that moves.
	answers atomic.Uint64
	// topicWatch is how often watchTopics looks whether records wait
	// without an answer (default topicWatchEvery).
	topicWatch time.Duration

	// idField is the router's table.field.event.id: the column holding
	// the event id, which keys dead letters and poison.
	idField string
	// at is the WAL position of the event in hand and its ordinal among
	// the events at that position (see identify).
	at rowID

	pubVecs sync.Map // topic -> prometheus.Counter, to skip label hashing per event

	lossSeen atomic.Bool // this session reported a sign of data loss (dataLoss)

	mu  sync.Mutex // guards txn.failed, which promises write
	txn txnState   // transactional mode: the open Kafka transaction
	eo  exactly    // the exactly-once position (Config.Offsets)
	idm idemState  // idempotent mode

	// span is the relay span of the record in hand (Config.Tracer), from
	// produce to sendIdem or sendTxn, which keep it with the record.
	span trace.Span
	// aggField is the router's route.by.field, an attribute of the span.
	aggField string

	promise func(*kgo.Record, error) // idemPromise, made once
	slab    []recEvent
}

// New returns a producer.
func New(cfg Config, client *kgo.Client, router *route.Router, pool *pgxpool.Pool, log *slog.Logger, m *metrics.Metrics) *Producer {
	idField, aggField := route.DefaultConfig().FieldEventID, route.DefaultConfig().RouteByField
	if router != nil {
		idField, aggField = router.Config().FieldEventID, router.Config().RouteByField
	}
	p := &Producer{
		cfg: cfg, client: client, admin: kadm.NewClient(client), router: router, pool: pool, log: log, metrics: m,
		topics: map[string]bool{}, idField: idField, aggField: aggField, topicWatch: topicWatchEvery,
	}
	p.eo.init(cfg.Offsets)
	if cfg.Offsets != nil {
		m.ExactlyOnceSkippedLast.Set(0)
		// Every commit's position record goes to it: watchTopics looks
		// for it too (see offsetsGone).
		p.seen.Store(cfg.Offsets.Topic, struct{}{})
	}
	return p
}

// deadLetterDB is what the producer needs of PostgreSQL: the dead-letter
// insert (see deadLetterTable). A *pgxpool.Pool is one; the unit tests
// give a table in memory, so that the dead-letter path is tested without a
// database.
type deadLetterDB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// minBufferedBytes is the least the producer buffers in bytes.
const minBufferedBytes = 16 << 20

// ClientOpts are the producer settings rule 1 and 3 need: idempotent, acks
// from all in-sync replicas, retries without limit (unknown topics too),
// bounded buffers so a slow Kafka blocks Produce instead of growing memory.
func ClientOpts(maxBuffered, maxMessageBytes int, compression string, linger time.Duration) []kgo.Opt {
	codec := map[string]kgo.CompressionCodec{
		"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
		"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
	}[compression]
	return []kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedRecords(maxBuffered),
		// Records are bounded in bytes too, so large payloads cannot grow
		// the heap past a few batches' worth.
		kgo.MaxBufferedBytes(BufferedBytes(maxMessageBytes)),
		kgo.ProducerBatchMaxBytes(int32(maxMessageBytes)),
		kgo.ProducerBatchCompression(codec),
		kgo.ProducerLinger(linger),
		kgo.UnknownTopicRetries(-1),
		// OUT_OF_ORDER_SEQUENCE_NUMBER (or UNKNOWN_PRODUCER_ID) means the
		// partition lost records of this producer that Kafka had acked. By
		// default franz-go's idempotent producer then takes a new epoch,
		// resets its sequence numbers and resends what it holds, where it
		// can no longer tell a duplicate from a first write nor keep the
		// batches in flight in order (sink.go, handleReqRespBatch), and
		// says so only at info level. ProducerOnDataLossDetected would
		// count it and let that go on. Stopping instead fails the
		// partition's records with the error: the session ends (classify:
		// transient) and the next reads the WAL again from the confirmed
		// position, in order, so nothing unconfirmed is lost or reordered;
		// the producer counts it and logs it at error (dataLoss), since
		// what Kafka lost of the confirmed events only the outbox table
		// can give back. A transactional producer fails the records so in
		// any case.
		kgo.StopProducerOnDataLossDetected(),
		// A topic just created has no leaders for a moment; the default
		// 5s between metadata refreshes would stall its first records.
		kgo.MetadataMinAge(250 * time.Millisecond),
		// Kafka's default partitioning (murmur2 of the key), unless a
		// partition placement of the router chose the partition.
		kgo.RecordPartitioner(route.Partitioner()),
	}
}

// isFatalKafka reports an error that is the deployment's fault (authorization,
// authentication): the line stops instead of dead-lettering everything.
func isFatalKafka(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) ||
		errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) ||
		errors.Is(err, kerr.IllegalSaslState) || errors.Is(err, kerr.UnsupportedSaslMechanism) ||
		errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.ProducerFenced)
}

// Run produces the events from in until in is closed, then flushes. It
// returns a *fatal.Error when Kafka refuses the deployment, an error
// wrapping ErrFenced when this instance may no longer publish, and another
// error when the session must end and the next one read again from the
// confirmed position (a record Kafka refused: see Poison); onFatal is
// called at once so the stream stops reading.
func (p *Producer) Run(ctx context.Context, in <-chan wal.Event, onFatal func()) error {
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		p.watchTopics(wctx)
	}()
	defer func() {
		stopWatch()
		<-watched
	}()
	if err := p.ensureTopic(ctx, p.cfg.DLQTopic); err != nil {
		onFatal()
		if errors.Is(err, kerr.InvalidTopicException) {
			return &fatal.Error{Msg: fmt.Sprintf("Kafka refused the dead-letter topic name %q; set OUTBOX_DLQ_TOPIC to a legal topic name", p.cfg.DLQTopic), Err: err}
		}
		return err
	}
	if p.cfg.Transactional {
		return p.runTxn(ctx, in, onFatal)
	}
	return p.runIdem(ctx, in, onFatal)
}

// handle routes one event and produces it (or its dead letter).
func (p *Producer) handle(ctx context.Context, ev wal.Event) error {
	id := p.identify(ev.Row)
	if p.covered(ev, id) {
		return nil
	}
	if ev.Err != nil {
		return p.deadLetter(ctx, ev, id, "", ev.Err)
	}
	backoff := retry.New(100*time.Millisecond, 10*time.Second)
	blocked := false
	for {
		rec, err := p.router.Route(ctx, ev.Row)
		if blocked && (err == nil || !route.IsRetryable(err)) {
			p.blocked("")
			blocked = false
		}
		if err == nil {
			return p.produce(ctx, ev, id, rec)
		}
		class := route.ClassOf(err)
		switch {
		case class.Skip():
			// Debezium's EventRouter skips this row (a delete, or an update
			// under table.op.invalid.behavior=warn): so do we, counted.
			p.metrics.Ignored.WithLabelValues("router-skip").Inc()
			p.in(ev, id)
			ev.Txn.Done()
			return nil
		case class.Fatal():
			return &fatal.Error{Msg: "the router refused a row (table.op.invalid.behavior=fatal)", Err: err}
		case class.Retryable():
			if p.cfg.Transactional && (p.txn.open || p.txn.pending != nil) {
				// The events before this one are routed and sent: commit
				// them before waiting, so that they reach consumers now
				// and no transaction stays open for as long as the
				// registry is out (the broker would abort it at its
				// timeout, and the session would end). The position it
				// carries counts them, not this one. A pipelined commit
				// in flight is settled too (commit does it first): its
				// records acked, or its failure seen, now.
				if err := p.commit(ctx); err != nil {
					return err
				}
			}
			wait := backoff.NextBackOff()
			p.metrics.RouteRetries.WithLabelValues(string(class)).Inc()
			if class == route.ClassSchemaRejected {
				// Not the registry's outage: its answer, which only an
				// operator changes. The line waits; say so loudly.
				p.log.Error("the schema registry refused the event's schema; the line waits and retries until it is changed", "err", err, "backoff", wait)
			} else {
				p.log.Warn("routing needs the schema registry, which failed; retrying", "err", err, "backoff", wait)
			}
			// What /healthz says while events wait (as for a missing topic).
			p.blocked(fmt.Sprintf("the line waits for the schema registry: %v", err))
			blocked = true
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		case class != "":
			return p.deadLetter(ctx, ev, id, intendedTopic(err), err)
		default:
			return fmt.Errorf("route event: %w", err)
		}
	}
}

func intendedTopic(err error) string {
	var te interface{ Topic() string }
	if errors.As(err, &te) {
		return te.Topic()
	}
	return ""
}

// RecordSize is the size a record is held to against
// OUTBOX_KAFKA_MAX_MESSAGE_BYTES: never below what it takes in a record
// batch of its own (TestRecordSizeCoversBatch), headers included, so that a
// record it passes is one Kafka can take. Every publisher of the connector
// (the producer, dead letters, connector backfill) measures with it.
func RecordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + len(r.Topic) + 64
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

func (p *Producer) produce(ctx context.Context, ev wal.Event, id rowID, rec *kgo.Record) error {
	if !p.valid() {
		return fmt.Errorf("%w (the leader lease's deadline passed)", ErrFenced)
	}
	if p.cfg.Headers != nil {
		rec.Headers = append(rec.Headers, p.cfg.Headers()...)
	}
	if size := RecordSize(rec); size > p.cfg.MaxMessageBytes {
		cause := &route.Error{Class: route.ClassTooLarge, Msg: fmt.Sprintf("record of about %d bytes is over the %d-byte limit (OUTBOX_KAFKA_MAX_MESSAGE_BYTES)", size, p.cfg.MaxMessageBytes)}
		return p.deadLetterTable(ctx, ev, id, rec.Topic, cause)
	}
	if !p.topics[rec.Topic] {
		if err := p.ensureTopic(ctx, rec.Topic); err != nil {
			// The topic's name, which the event's aggregatetype made, is
			// the record's fault; its settings (refused with a
			// fatal.Error) are the deployment's.
			if errors.Is(err, kerr.InvalidTopicException) {
				return p.deadLetter(ctx, ev, id, rec.Topic, &route.Error{Class: route.ClassInvalidTopic, Msg: "Kafka refused to create the topic", Err: err})
			}
			return err
		}
	}
	if p.cfg.Tracer != nil {
		p.span = p.relaySpan(ev, rec)
		defer func() {
			// A record that went no further (refused before it was
			// produced, the session ending) ends its span here.
			if p.span != nil {
				endSpan(p.span, errNotProduced)
				p.span = nil
			}
		}()
	}
	return p.send(ctx, ev, id, rec, "", nil)
}

// errNotProduced ends the span of a record that was not produced as itself
// (dead-lettered instead, or the session ended first).
var errNotProduced = errors.New("record not produced")

// send produces rec, the record of ev, in the mode's way, unless Kafka
// refused it before (see Poison): a suspect is produced alone, a guilty one
// is dead-lettered. dead, when not nil, is why ev is a dead letter: rec is
// its DLQ record, for the topic intended.
func (p *Producer) send(ctx context.Context, ev wal.Event, id rowID, rec *kgo.Record, intended string, dead error) error {
	if !p.valid() {
		return fmt.Errorf("%w (the leader lease's deadline passed)", ErrFenced)
	}
	if v, ok := p.cfg.Poison.lookup(rec.Topic, id); ok {
		if v.guilty {
			return p.convicted(ctx, ev, id, rec.Topic, intended, dead, v.err)
		}
		return p.alone(ctx, ev, id, rec, intended, dead, v.err)
	}
	if p.cfg.Transactional {
		return p.sendTxn(ctx, ev, id, rec, intended, dead != nil)
	}
	return p.sendIdem(ctx, ev, id, rec, dead != nil)
}

// alone produces a suspect on its own, after everything before it is acked
// (committed) and before anything after it: taken, it was innocent and is
// published in its place; refused again, it is guilty and dead-lettered.
// suspected is the error its batch failed with; dead is as for send.
func (p *Producer) alone(ctx context.Context, ev wal.Event, id rowID, rec *kgo.Record, intended string, dead error, suspected error) error {
	dlq := dead != nil
	key := poisonKey(rec.Topic, id)
	lsn := wal.FormatLSN(ev.Row.Source.LSN)
	var err error
	if p.cfg.Transactional {
		err = p.aloneTxn(ctx, ev, id, rec, intended, dlq)
	} else {
		err = p.aloneIdem(ctx, ev, rec, dlq)
	}
	var rf *refusedError
	switch {
	case err == nil:
		p.cfg.Poison.acquit(key)
		p.metrics.KafkaRefused.WithLabelValues(rec.Topic, "innocent").Inc()
		p.log.Info("a record whose batch Kafka refused was taken alone: it was not at fault, and is published", "topic", rec.Topic, "lsn", lsn, "batch_err", suspected)
		return nil
	case errors.As(err, &rf) && !p.cfg.Poison.refusedAlone(key, rf.err):
		p.log.Warn("Kafka refused a record produced alone with an error that may not be its own; it stays a suspect and is tried alone again after the session's backoff", "topic", rec.Topic, "lsn", lsn, "err", rf.err)
		return err
	case errors.As(err, &rf):
		p.cfg.Poison.convict(key, rf.err)
		p.metrics.KafkaRefused.WithLabelValues(rec.Topic, "guilty").Inc()
		p.log.Warn("Kafka refused a record produced alone: it is at fault; dead-lettering it", "topic", rec.Topic, "lsn", lsn, "err", rf.err)
		return p.convicted(ctx, ev, id, rec.Topic, intended, dead, rf.err)
	}
	return err
}

// convicted dead-letters the event of a record Kafka refused alone with
// err, for its topic. A DLQ record Kafka refused (dead is why its event is
// a dead letter) goes to the table, with both reasons: the table row must
// still say why the event is poison, not only why the DLQ topic did not
// take it.
func (p *Producer) convicted(ctx context.Context, ev wal.Event, id rowID, topic, intended string, dead, err error) error {
	if dead != nil {
		return p.deadLetterTable(ctx, ev, id, intended, &dlqRefusedError{cause: dead, topic: topic, err: err})
	}
	cause := refusedCause(err)
	if cause.Class == route.ClassTooLarge {
		return p.deadLetterTable(ctx, ev, id, topic, cause)
	}
	return p.deadLetter(ctx, ev, id, topic, cause)
}

// acked does what Kafka's ack of a record means: counted, done.
func (p *Producer) acked(ev wal.Event, topic string, dlq bool) {
	if !dlq {
		p.published(topic).Inc()
		if p.cfg.Published != nil {
			p.cfg.Published.Add(1)
		}
		if !ev.Row.Source.CommitTime.IsZero() {
			p.metrics.CommitToAck.Observe(time.Since(ev.Row.Source.CommitTime).Seconds())
		}
	}
	ev.Txn.Done()
}

func (p *Producer) published(topic string) interface{ Inc() } {
	if c, ok := p.pubVecs.Load(topic); ok {
		return c.(interface{ Inc() })
	}
	c := p.metrics.Published.WithLabelValues(topic)
	p.pubVecs.Store(topic, c)
	return c
}

// ensureTopic creates a missing topic, retrying transient failures until ctx
// ends.
func (p *Producer) ensureTopic(ctx context.Context, topic string) error {
	if p.topics[topic] {
		return nil
	}
	if !p.cfg.TopicCreate {
		if err := p.waitTopic(ctx, topic); err != nil {
			return err
		}
		if err := p.checkTopicLimit(ctx, topic); err != nil {
			return err
		}
		p.known(topic)
		return nil
	}
	backoff := retry.New(100*time.Millisecond, 5*time.Second)
	for {
		resp, err := p.admin.CreateTopic(ctx, p.cfg.TopicPartitions, p.cfg.TopicReplication, p.cfg.TopicConfigs, topic)
		if err == nil {
			err = resp.Err
		}
		switch {
		case err == nil:
			p.log.Info("created topic", "topic", topic, "partitions", p.cfg.TopicPartitions)
			fallthrough
		case errors.Is(err, kerr.TopicAlreadyExists):
			if err := p.checkTopicLimit(ctx, topic); err != nil {
				return err
			}
			p.known(topic)
			return nil
		case isFatalKafka(err):
			return &fatal.Error{Msg: fmt.Sprintf("Kafka refused to create topic %q; grant CREATE, or create the topics yourself and set OUTBOX_TOPIC_CREATE=false", topic), Err: err}
		case errors.Is(err, kerr.InvalidTopicException):
			return err
		case errors.Is(err, kerr.InvalidConfig), errors.Is(err, kerr.InvalidReplicationFactor),
			errors.Is(err, kerr.InvalidPartitions), errors.Is(err, kerr.InvalidReplicaAssignment),
			errors.Is(err, kerr.PolicyViolation):
			// Retrying would loop forever: the settings are the
			// deployment's, the same for every topic, and only an operator
			// can change them.
			return &fatal.Error{Msg: fmt.Sprintf("Kafka refused to create topic %q with %d partitions, replication factor %d and the configs of OUTBOX_TOPIC_CONFIGS; correct OUTBOX_TOPIC_PARTITIONS, OUTBOX_TOPIC_REPLICATION_FACTOR or OUTBOX_TOPIC_CONFIGS (or the broker's create-topic policy), or create the topics yourself and set OUTBOX_TOPIC_CREATE=false",
				topic, p.cfg.TopicPartitions, p.cfg.TopicReplication), Err: err}
		}
		wait := backoff.NextBackOff()
		p.log.Warn("create topic failed; retrying", "topic", topic, "err", err, "backoff", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// waitTopic waits, with a growing pause, until topic exists, saying so at
// every look: without OUTBOX_TOPIC_CREATE the connector may not create it,
// and franz-go would otherwise hold its records without a word
// (UnknownTopicRetries(-1)), the line stopped silently. The events for it
// and every event after them wait (skipping them would break the order);
// the error log line, outbox_connector_topic_missing{topic} and the Blocked
// hook tell the operator what to do. A topic whose existence cannot be read
// (the lookup failed, or Kafka answered another error for it) is looked up
// again after the same pause, said at warn level and to the Blocked hook:
// let through, a missing one would wait in franz-go without a word. Refused
// access is fatal; a name Kafka calls invalid is returned (the event's
// fault: it becomes a dead letter).
func (p *Producer) waitTopic(ctx context.Context, topic string) error {
	backoff := retry.New(time.Second, 30*time.Second)
	for waited := false; ; waited = true {
		details, err := p.admin.ListTopics(ctx, topic)
		if err == nil {
			if d, ok := details[topic]; !ok {
				err = kerr.UnknownTopicOrPartition
			} else {
				err = d.Err
			}
		}
		switch {
		case err == nil:
			if waited {
				p.log.Info("the topic exists now; publishing its events", "topic", topic)
				p.metrics.TopicMissing.WithLabelValues(topic).Set(0)
				p.blocked("")
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case isFatalKafka(err):
			return &fatal.Error{Msg: fmt.Sprintf("Kafka refused to describe topic %q; grant DESCRIBE on the topics", topic), Err: err}
		case errors.Is(err, kerr.InvalidTopicException):
			return err
		case !errors.Is(err, kerr.UnknownTopicOrPartition):
			msg := fmt.Sprintf("cannot tell whether topic %q exists (OUTBOX_TOPIC_CREATE=false): looking it up failed: %v; its events and all after them wait", topic, err)
			wait := backoff.NextBackOff()
			p.log.Warn(msg, "topic", topic, "err", err, "retry_in", wait)
			p.blocked(msg)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
			continue
		}
		msg := fmt.Sprintf("topic %q does not exist and OUTBOX_TOPIC_CREATE=false: its events and all after them wait; create it (kafka-topics.sh --create --topic %s) or set OUTBOX_TOPIC_CREATE=true", topic, topic)
		wait := backoff.NextBackOff()
		p.log.Error(msg, "topic", topic, "retry_in", wait)
		p.metrics.TopicMissing.WithLabelValues(topic).Set(1)
		p.blocked(msg)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// isDataLoss reports Kafka's answers that it lost, or forgot, records of
// this producer it had acked (see ClientOpts).
func isDataLoss(err error) bool {
	return errors.Is(err, kerr.OutOfOrderSequenceNumber) || errors.Is(err, kerr.UnknownProducerID)
}

// dataLoss says aloud, once per session, that Kafka answered a record of
// topic with err, a sign of data loss (isDataLoss); the record fails, and
// the session ends. Once: franz-go fails the producer ID with that error,
// and records of other topics produced before the session halts fail with
// it too, though Kafka said nothing of them. It may run on franz-go's
// promise goroutine: it does not block.
func (p *Producer) dataLoss(topic string, err error) {
	if p.lossSeen.Swap(true) {
		return
	}
	p.metrics.KafkaDataLoss.WithLabelValues(topic).Inc()
	p.log.Error("Kafka may have lost records of this producer that it had acknowledged (an unclean leader election, a truncated log): events confirmed before may be missing from the topic; compare the topic with the outbox table and re-insert what is missing. This session ends; the next reads the WAL again from the confirmed position",
		"topic", topic, "err", err)
}

// known records that topic exists.
func (p *Producer) known(topic string) {
	p.topics[topic] = true
	p.seen.Store(topic, struct{}{})
}

// topicWatchEvery is how often watchTopics looks.
const topicWatchEvery = 5 * time.Second

// watchTopics looks, every topicWatch, whether records wait in the client
// with no promise run since the last look, and then whether every topic
// the session has seen still exists. A topic deleted after it was seen is
// not reported by franz-go, which holds its records without a word
// (UnknownTopicRetries(-1)) and the line behind them: it is said aloud as
// waitTopic says a missing one (an error log line, outbox_connector_topic_missing,
// the Blocked hook) until it exists again. Created again, it has a new
// topic ID: franz-go fails the records waiting for it (UNKNOWN_TOPIC_ID,
// transient), and the next session reads them again (and, with
// OUTBOX_TOPIC_CREATE, creates the topic first if it is still missing). A
// look that fails is tried again at the next. The exactly-once offsets
// topic is looked for too; found deleted, it ends the session (see
// offsetsGone). A deletion is so seen between one and two looks after the
// line stopped: 5 to 10 s.
func (p *Producer) watchTopics(ctx context.Context) {
	every := p.topicWatch
	if every <= 0 {
		every = topicWatchEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := p.answers.Load()
	missing := map[string]bool{}
	defer func() {
		// The session ends: the next one looks for these again (waitTopic,
		// or ensureTopic creating them), and says so if they still lack.
		// The offsets topic's alarm stays until the next start has made
		// sure of the topic (the relay's exactlyOnce), and so does its
		// reason, which is also the error the session ends with.
		cleared := false
		for topic := range missing {
			if !p.isOffsets(topic) {
				p.metrics.TopicMissing.WithLabelValues(topic).Set(0)
				cleared = true
			}
		}
		if cleared && p.eo.lost() == nil {
			p.blocked("")
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n := p.answers.Load()
		waiting := n == last && p.buffered() > 0
		last = n
		if !waiting && len(missing) == 0 {
			continue
		}
		var topics []string
		p.seen.Range(func(k, _ any) bool {
			topics = append(topics, k.(string))
			return true
		})
		if len(topics) == 0 {
			continue
		}
		details, err := p.admin.ListTopics(ctx, topics...)
		if err != nil {
			p.log.Debug("could not look whether the topics records wait for exist", "err", err)
			continue
		}
		for _, topic := range topics {
			d, ok := details[topic]
			gone := !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition)
			switch {
			case gone && !missing[topic] && waiting && p.isOffsets(topic):
				missing[topic] = true
				p.offsetsGone(topic)
			case gone && !missing[topic] && waiting:
				missing[topic] = true
				fix := "create it again (kafka-topics.sh --create --topic " + topic + ") or set OUTBOX_TOPIC_CREATE=true"
				if p.cfg.TopicCreate {
					fix = "creating it again (OUTBOX_TOPIC_CREATE=true)"
				}
				msg := fmt.Sprintf("topic %q was deleted after the connector saw it: its records wait in the Kafka client, and all after them; %s", topic, fix)
				p.log.Error(msg, "topic", topic)
				p.metrics.TopicMissing.WithLabelValues(topic).Set(1)
				p.blocked(msg)
				if p.cfg.TopicCreate {
					// Failing, it is tried again at the next look.
					resp, err := p.admin.CreateTopic(ctx, p.cfg.TopicPartitions, p.cfg.TopicReplication, p.cfg.TopicConfigs, topic)
					if err == nil {
						err = resp.Err
					}
					if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
						p.log.Warn("create the deleted topic again failed; trying again at the next look", "topic", topic, "err", err)
						delete(missing, topic)
					}
				}
			case !gone && missing[topic]:
				delete(missing, topic)
				p.log.Info("the topic exists again", "topic", topic)
				p.metrics.TopicMissing.WithLabelValues(topic).Set(0)
				p.blocked("")
			}
		}
	}
}

// buffered is how many records wait in the session's clients.
func (p *Producer) buffered() int64 {
	n := p.client.BufferedProduceRecords()
	if p.cfg.Pipeline != nil {
		n += p.cfg.Pipeline.BufferedProduceRecords()
	}
	return n
}

func (p *Producer) blocked(reason string) {
	if p.cfg.Blocked != nil {
		p.cfg.Blocked(reason)
	}
}

// checkTopicLimit refuses a topic whose max.message.bytes is below
// OUTBOX_KAFKA_MAX_MESSAGE_BYTES: the producer fills batches up to the
// latter, and Kafka would reject whole batches of small records for that
// topic again and again. A topic whose settings cannot be read (no
// DESCRIBE_CONFIGS permission, not created yet) is let through.
func (p *Producer) checkTopicLimit(ctx context.Context, topic string) error {
	rcs, err := p.admin.DescribeTopicConfigs(ctx, topic)
	if err == nil {
		var rc kadm.ResourceConfig
		rc, err = rcs.On(topic, nil)
		if err == nil {
			err = rc.Err
		}
		if err == nil {
			for _, c := range rc.Configs {
				if c.Key != "max.message.bytes" || c.Value == nil {
					continue
				}
				limit, perr := strconv.Atoi(*c.Value)
				if perr == nil && limit < p.cfg.MaxMessageBytes {
					return &fatal.Error{Msg: fmt.Sprintf("topic %q accepts record batches of at most %d bytes (its max.message.bytes), below OUTBOX_KAFKA_MAX_MESSAGE_BYTES=%d; raise the topic's max.message.bytes (kafka-configs --alter --entity-type topics --entity-name %s --add-config max.message.bytes=%d) or lower OUTBOX_KAFKA_MAX_MESSAGE_BYTES to %d",
						topic, limit, p.cfg.MaxMessageBytes, topic, p.cfg.MaxMessageBytes, limit)}
				}
			}
			return nil
		}
	}
	p.log.Debug("could not read the topic's max.message.bytes", "topic", topic, "err", err)
	return nil
}

// deadLetter produces the DLQ record for an event; a DLQ record too large
// for Kafka goes to the table instead.
func (p *Producer) deadLetter(ctx context.Context, ev wal.Event, id rowID, intended string, cause error) error {
	var rec *kgo.Record
	if p.router != nil {
		rec = p.router.DeadLetter(ev.Row, intended, cause, p.cfg.DLQTopic)
	} else {
		rec = route.DeadLetter(ev.Row, intended, cause, p.cfg.DLQTopic)
	}
	if p.cfg.Headers != nil {
		rec.Headers = append(rec.Headers, p.cfg.Headers()...)
	}
	if RecordSize(rec) > p.cfg.MaxMessageBytes {
		return p.deadLetterTable(ctx, ev, id, intended, cause)
	}
	class := classOf(cause)
	p.log.Warn("dead-lettering an event to the DLQ topic", "topic", intended, "dlq", p.cfg.DLQTopic, "class", class, "lsn", wal.FormatLSN(ev.Row.Source.LSN), "err", cause)
	p.metrics.DeadLettered.WithLabelValues(intended, class, "topic").Inc()
	return p.send(ctx, ev, id, rec, intended, cause)
}

func classOf(err error) string {
	var re *route.Error
	if errors.As(err, &re) {
		return string(re.Class)
	}
	return "unknown"
}

// insertDeadLetter stores a dead letter unless a row with its id is there
// already, and says which: inserted, or whether the row there holds the
// same event (the same columns: a repeat after a restart read it again).
// The outer SELECT sees the table as it was before the INSERT, so "same"
// is about a row stored earlier.
const insertDeadLetter = `
WITH ins AS (
    INSERT INTO public.outbox_dead_letter (id, aggregatetype, aggregateid, type, payload, row_data, column_types, topic, error, error_class, source_lsn)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::pg_lsn)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1)
SELECT EXISTS (SELECT 1 FROM ins),
       EXISTS (SELECT 1 FROM public.outbox_dead_letter WHERE id = $1 AND row_data = $6::jsonb)`

// maxDeadLetterIDs bounds the distinct ids tried for one dead letter whose
// event id is taken by other events (see deadLetterTable).
const maxDeadLetterIDs = 100

// deadLetterTable keeps an event whole in outbox_dead_letter (synchronously,
// retrying until it is stored: it is acked only once durable).
//
// The row's id is the event id (table.field.event.id), as the table's
// contract says. An event without one gets an id from its place in the WAL
// (commit LSN, LSN, ordinal: see rowID), the same in every session, unique
// among events (the rows of a snapshot all have LSN 0, those of a COPY share
// theirs). When the id is taken, the stored row is compared: the same event
// is a repeat (the session before stored it, then stopped before its
// position was confirmed) and is acked; a different event (an event id
// reused by the application) is stored under the id with a suffix, "#2",
// "#3"..., and a warning says so. A dead letter is never acked unless its
// row is in the table.
//
// What PostgreSQL's text and jsonb cannot hold (a NUL byte, bytes that are
// not UTF-8: a logical message's raw content, say) is stored encoded (see
// deadLetterValues), never replaced. An insert PostgreSQL refuses for the
// row's values (a data exception, SQLSTATE class 22, or a program limit,
// class 54: an event id longer than the primary key's index takes) would
// be refused on every try, wedging the line: the row is stored once more in
// its safe form, and if even that is refused the connector stops with a
// fatal.Error naming the event rather than retry forever or skip it. Every
// other error (the table missing, a privilege, the database down) is the
// deployment's, and retried with a capped backoff.
func (p *Producer) deadLetterTable(ctx context.Context, ev wal.Event, id rowID, intended string, cause error) error {
	row := ev.Row
	// The event's place in the WAL, which no other event has.
	place := "lsn:" + wal.FormatLSN(id.commit) + ":" + wal.FormatLSN(id.lsn) + ":" + strconv.FormatUint(uint64(id.ord), 10)
	dl := deadLetterValuesOf(row, p.idField, place, intended, cause, nil)
	eventID := dl.id
	class := classOf(cause)
	backoff := retry.New(100*time.Millisecond, 5*time.Second)
	key, n := eventID, 1
	for {
		if !p.valid() {
			return fmt.Errorf("%w (the leader lease's deadline passed)", ErrFenced)
		}
		var inserted, same bool
		err := p.pool.QueryRow(ctx, insertDeadLetter, key, dl.aggType, dl.aggID, dl.typ, dl.payload,
			dl.data, dl.types, dl.topic, dl.errText, class, wal.FormatLSN(row.Source.LSN)).Scan(&inserted, &same)
		if err == nil {
			if inserted || same {
				break
			}
			// Another event holds this id: keep this one too, under
			// the next free one; past maxDeadLetterIDs of them, under
			// the id and its place in the WAL, which no other event has.
			switch n++; {
			case n == maxDeadLetterIDs+1:
				key = eventID + "@" + place
				p.log.Warn("the event id and its suffixed variants are all taken by other dead letters; storing this event under the id and its place in the WAL", "id", eventID, "stored_as", key)
				continue
			case n > maxDeadLetterIDs+1:
				err = fmt.Errorf("event id %q, %d variants of it and its place in the WAL are taken by other dead letters", eventID, maxDeadLetterIDs)
			default:
				p.log.Warn("another dead letter holds this event id; storing this event under a suffixed id", "id", eventID, "stored_as", eventID+"#"+strconv.Itoa(n), "lsn", wal.FormatLSN(row.Source.LSN))
				key = eventID + "#" + strconv.Itoa(n)
				continue
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if rowsFault(err) {
			if dl.safe {
				return &fatal.Error{Msg: fmt.Sprintf("PostgreSQL refused the dead letter of the event at LSN %s even in its safe form (id %q, every value base64-encoded); the connector stops rather than skip it: check outbox_dead_letter's definition against sql/003_dead_letter.sql",
					wal.FormatLSN(row.Source.LSN), dl.id), Err: err}
			}
			// Refused for its values: the same insert would be refused
			// forever. Store it in the form every database takes.
			dl = deadLetterValuesOf(row, p.idField, place, intended, cause, err)
			eventID, key, n = dl.id, dl.id, 1
			p.log.Warn("PostgreSQL refused the dead letter's values; storing it under its place in the WAL with every value base64-encoded in row_data", "id", eventID, "lsn", wal.FormatLSN(row.Source.LSN), "err", err)
			continue
		}
		wait := backoff.NextBackOff()
		p.log.Warn("storing a dead letter in outbox_dead_letter failed; retrying", "err", err, "backoff", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	p.log.Warn("dead-lettered an event to the outbox_dead_letter table", "id", key, "topic", intended, "class", class, "lsn", wal.FormatLSN(row.Source.LSN), "err", cause)
	p.metrics.DeadLettered.WithLabelValues(intended, class, "table").Inc()
	p.in(ev, id)
	ev.Txn.Done()
	return nil
}

// rowsFault reports an error PostgreSQL gives for a statement's values, the
// same on every try: a data exception (class 22: 22P05 "unsupported Unicode
// escape sequence" for a NUL in jsonb, 22021 for a NUL or bytes that are not
// UTF-8 in text) or a program limit (class 54: an index row too large).
func rowsFault(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	return pgErr.Code[:2] == "22" || pgErr.Code[:2] == "54"
}

// deadLetterValues are the columns of an event's outbox_dead_letter row.
type deadLetterValues struct {
	id                           string
	aggType, aggID, typ, payload *string
	data, types                  []byte
	topic, errText               string
	safe                         bool // the safe form (see deadLetterValuesOf)
}

// deadLetterValuesOf builds the row of an event's dead letter. row_data
// holds every column: its text as a JSON string, SQL NULL as null, and a
// value text cannot hold (a NUL byte, bytes that are not UTF-8, which jsonb
// refuses or json.Marshal would replace) as {"base64": "<its bytes>"}, so
// that every byte is kept. The text columns (id, aggregatetype, ...) show
// such a value with \xNN escapes, and the error column says that some value
// is encoded.
//
// refused, when not nil, is why PostgreSQL refused that row: the safe form
// is built instead, which any database takes whatever its encoding and
// limits: the id is the event's place in the WAL (short, unique; the event
// id is in row_data), every value of row_data is base64, the text columns
// and the error are ASCII.
func deadLetterValuesOf(row *route.Row, idField, place, intended string, cause error, refused error) deadLetterValues {
	safe := refused != nil
	encoded := false
	text := func(b []byte) string {
		switch {
		case safe:
			q := strconv.QuoteToASCII(string(b))
			return q[1 : len(q)-1]
		case storable(b):
			return string(b)
		}
		encoded = true
		return escapeText(b)
	}
	col := func(name string) *string {
		if c := row.Lookup(name); c != nil && !c.Null {
			s := text(c.Value)
			return &s
		}
		return nil
	}
	obj := make(map[string]any, len(row.Columns))
	types := make(map[string]uint32, len(row.Columns))
	for _, c := range row.Columns {
		name := text([]byte(c.Name))
		switch {
		case c.Null:
			obj[name] = nil
		case !safe && storable(c.Value):
			obj[name] = string(c.Value)
		default:
			encoded = true
			obj[name] = map[string]string{"base64": base64.StdEncoding.EncodeToString(c.Value)}
		}
		types[name] = c.Type
	}
	v := deadLetterValues{id: place, aggType: col("aggregatetype"), aggID: col("aggregateid"), typ: col("type"), payload: col("payload"), safe: safe}
	if c := row.Lookup(idField); c != nil && !c.Null && !safe {
		v.id = text(c.Value)
	}
	v.data, _ = json.Marshal(obj)
	v.types, _ = json.Marshal(types)
	v.topic = text([]byte(intended))
	v.errText = text([]byte(cause.Error()))
	switch {
	case safe:
		v.errText += "; stored in its safe form, PostgreSQL having refused the row as it was (" + text([]byte(refused.Error())) +
			"): the id is the event's place in the WAL, every value of row_data is {\"base64\": ...}, the text columns are ASCII-escaped"
	case encoded:
		v.errText += "; some values hold what PostgreSQL text cannot (a NUL byte, bytes that are not UTF-8): row_data has them as {\"base64\": ...}, the text columns with \\xNN escapes"
	}
	return v
}

// storable reports whether PostgreSQL text and jsonb hold b as it is: UTF-8
// without a NUL byte.
func storable(b []byte) bool { return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 }

// escapeText is b with a NUL and every byte that is not part of valid UTF-8
// written as \xNN, for a text column a person reads.
func escapeText(b []byte) string {
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == 0 || r == utf8.RuneError && size <= 1 {
			out = append(out, '\\', 'x', "0123456789ABCDEF"[b[0]>>4], "0123456789ABCDEF"[b[0]&0xF])
			b = b[1:]
			continue
		}
		out = append(out, b[:size]...)
		b = b[size:]
	}
	return string(out)
}
