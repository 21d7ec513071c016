// Package metrics holds the connector's Prometheus collectors, on a private
// registry served at /metrics.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the connector's collectors.
type Metrics struct {
	Registry *prometheus.Registry

	Published      *prometheus.CounterVec
	DeadLettered   *prometheus.CounterVec
	Ignored        *prometheus.CounterVec
	Refused        prometheus.Counter
	StatusUpdates  prometheus.Counter
	Reconnects     *prometheus.CounterVec
	CommitToAck    prometheus.Histogram
	LeaseToken     prometheus.Gauge
	Takeovers      prometheus.Counter
	SnapshotEvents prometheus.Counter
	// SlotRecoveries counts slots recovered from the outbox table
	// (OUTBOX_ON_SLOT_LOSS=recover).
	SlotRecoveries prometheus.Counter
	// KafkaTxns counts Kafka transactions by result (commit, abort).
	KafkaTxns *prometheus.CounterVec
	// KafkaTxnCommit is how long a commit takes: flushing the transaction's
	// records, then ending it.
	KafkaTxnCommit prometheus.Histogram
	// KafkaRefused counts records Kafka refused for their own account
	// (INVALID_TIMESTAMP, INVALID_RECORD, MESSAGE_TOO_LARGE, ...), by
	// topic and verdict: suspect when a batch holding it failed, innocent
	// when it then passed alone, guilty when it failed alone too (and was
	// dead-lettered).
	KafkaRefused *prometheus.CounterVec
	// TopicMissing is 1 for a topic the connector waits for: it does not
	// exist and OUTBOX_TOPIC_CREATE=false.
	TopicMissing *prometheus.GaugeVec
	// OrderViolations counts records the idempotent producer saw acked
	// after an earlier record of their key had failed: consumers may see
	// them before it. Expected to stay 0 (see publish's idemPromise).
	OrderViolations prometheus.Counter
	// KafkaDataLoss counts the sessions in which Kafka answered a produce
	// with OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID, by the topic
	// of the first record it failed:
	// it may have lost records it had acknowledged (an unclean leader
	// election). Each ends its session (publish.ClientOpts).
	KafkaDataLoss *prometheus.CounterVec
	// ExactlyOnceSkipped counts events the slot gave again that the
	// exactly-once position read back at a session's start covered: they
	// were in Kafka already, and were not published again.
	ExactlyOnceSkipped prometheus.Counter
	// ExactlyOnceSkippedLast is that count for the last session start.
	ExactlyOnceSkippedLast prometheus.Gauge
	// RouteRetries counts routing attempts that failed for the schema
	// registry's sake and wait to be tried again, by class
	// (registry-unavailable, schema-rejected): the line waits meanwhile.
	RouteRetries *prometheus.CounterVec
	// PollQueries counts poll mode's statements on the primary, by kind
	// (read, mark, readers, lock, unlock): its load on the database.
	PollQueries *prometheus.CounterVec
	// PollRows counts the rows poll mode's reads returned (each is
	// published once in the normal case: rows per event is this over
	// events published).
	PollRows prometheus.Counter
	// PollBuckets is how many buckets of the outbox this instance owns in
	// poll mode.
	PollBuckets prometheus.Gauge
	// PollReadSeconds is how long poll mode's reads of unpublished rows
	// take: the reads walk the index entries of rows marked since the
	// oldest transaction still running began (a held xmin horizon keeps
	// them), so a read that grows slow says so before it passes the
	// statement bound.
	PollReadSeconds prometheus.Histogram
	// StreamSilent counts replication streams ended because the server
	// sent nothing for the silence timeout, not even the answer to a
	// status update that asked for one (wal.ErrSilent).
	StreamSilent prometheus.Counter
	// StateWriteFailures counts writes of the state row
	// (outbox_connector_state) that failed: each ends its session, and
	// nothing is confirmed to PostgreSQL past the last that passed.
	StateWriteFailures prometheus.Counter
	// WalsenderHeld is how long PostgreSQL has held the session's
	// replication connection, by what for (see wal.Hold): transactions
	// (creating the slot, it waits for the transactions running then to
	// end) or standby (a failover slot's changes wait for the standbys of
	// synchronized_standby_slots); 0 when it does not.
	WalsenderHeld *prometheus.GaugeVec
	// WalsenderHeldBy is 1 for each transaction (by="prepared:<gid>" or
	// "pid:<pid>") or standby slot (by="slot:<name>") it waits for.
	WalsenderHeldBy *prometheus.GaugeVec
	// outbox_connector_leader is a gauge function the relay registers
	// (computed at scrape time from the lease, see relay.New).
}

// New registers the collectors on a new registry.
func New() *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		Registry: r,
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_events_published_total",
			Help: "Outbox events acknowledged by Kafka, by topic.",
		}, []string{"topic"}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_events_dead_lettered_total",
			Help: "Outbox events kept whole as dead letters, by intended topic, error class and sink (topic or table).",
		}, []string{"topic", "class", "sink"}),
		Ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_changes_ignored_total",
			Help: "Decoded changes that are not outbox events (updates, deletes, truncates, other tables), by kind.",
		}, []string{"kind"}),
		Refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_messages_refused_total",
			Help: "Non-transactional logical messages with prefix outbox, refused (never published).",
		}),
		StatusUpdates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_status_updates_total",
			Help: "Standby status updates sent to PostgreSQL.",
		}),
		StreamSilent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_stream_silent_total",
			Help: "Replication streams ended because the server sent nothing for OUTBOX_STREAM_SILENCE_TIMEOUT, not even the answer to a status update that asked for one: the network path went silent; the connector reconnects.",
		}),
		Reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_reconnects_total",
			Help: "Reconnections after a transient failure, by target (postgres, kafka).",
		}, []string{"target"}),
		CommitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_connector_commit_to_ack_seconds",
			Help:    "Time from the event's transaction commit in PostgreSQL to Kafka's acknowledgement.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		LeaseToken: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_connector_lease_token",
			Help: "The fencing token of the lease this instance holds or last held.",
		}),
		Takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_takeovers_total",
			Help: "Times this instance acquired the leader lease.",
		}),
		KafkaTxns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_kafka_transactions_total",
			Help: "Kafka transactions ended, by result (commit, abort).",
		}, []string{"result"}),
		KafkaTxnCommit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_connector_kafka_transaction_commit_seconds",
			Help:    "Time to commit a Kafka transaction: flush its records, then end it.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		KafkaRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_kafka_refused_records_total",
			Help: "Records Kafka refused for their own account, by topic and verdict (suspect: its batch failed; innocent: it passed alone; guilty: it failed alone and was dead-lettered).",
		}, []string{"topic", "verdict"}),
		TopicMissing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outbox_connector_topic_missing",
			Help: "1 while the connector waits for a topic that does not exist (OUTBOX_TOPIC_CREATE=false).",
		}, []string{"topic"}),
		OrderViolations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_order_violations_total",
			Help: "Records acked by Kafka after an earlier record of the same key failed (idempotent mode); consumers may have seen them out of order.",
		}),
		KafkaDataLoss: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_kafka_data_loss_detections_total",
			Help: "Detections, once per session, of Kafka answering a produce with OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID, by the topic of the first record it failed: records it had acknowledged may be lost (an unclean leader election); the session ends and reads the WAL again from the confirmed position.",
		}, []string{"topic"}),
		ExactlyOnceSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_exactly_once_skipped_events_total",
			Help: "Events the slot replayed that the exactly-once position in Kafka already covered, so they were not published again.",
		}),
		ExactlyOnceSkippedLast: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_connector_exactly_once_skipped_events_last_session",
			Help: "Events skipped as already in Kafka by the current (or last) session, since it started.",
		}),
		RouteRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_route_retries_total",
			Help: "Routing attempts that failed for the schema registry's sake and are tried again after a backoff, the line waiting meanwhile, by class (registry-unavailable: it did not answer; schema-rejected: it refused the event's schema, which only an operator changes).",
		}, []string{"class"}),
		SnapshotEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_snapshot_events_total",
			Help: "Rows published by snapshots: initial ones, and the windows of slot recoveries.",
		}),
		SlotRecoveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_slot_recoveries_total",
			Help: "Lost slots (gone, invalidated, or ahead of the state row) replaced by a new one, with the events that may not have been delivered published again from the outbox table (OUTBOX_ON_SLOT_LOSS=recover).",
		}),
		PollQueries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_connector_poll_queries_total",
			Help: "Statements poll mode (OUTBOX_SOURCE=poll) ran on the database, by kind (read, mark, readers, lock, unlock).",
		}, []string{"kind"}),
		PollRows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_connector_poll_rows_read_total",
			Help: "Unpublished rows poll mode's reads returned.",
		}),
		PollBuckets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_connector_poll_buckets_owned",
			Help: "Buckets of the outbox (by hash of the aggregate id) this instance owns in poll mode.",
		}),
		PollReadSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_connector_poll_read_seconds",
			Help:    "Poll mode: duration of each read of unpublished rows. Slow reads mean the read walks many index entries of marked rows that a held xmin horizon (a long transaction, a standby's feedback, a slot's xmin) keeps from vacuum, or a large backlog.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
	}
	r.MustRegister(m.PollReadSeconds)
	m.StateWriteFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outbox_connector_state_write_failures_total",
		Help: "Writes of the state row public.outbox_connector_state that failed (a trigger, a privilege, a row lock held longer than the write's lock_timeout): a position is confirmed to PostgreSQL only after the row records it, so while they fail the slot's confirmed position stands still and the WAL grows.",
	})
	r.MustRegister(m.StateWriteFailures)
	m.WalsenderHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "outbox_connector_walsender_held_seconds",
		Help: "How long PostgreSQL has held the session's replication connection, by what for: transactions (CREATE_REPLICATION_SLOT waits for every transaction running when it began, holding a transaction id, to end: a forgotten prepared transaction holds it for ever) or standby (PostgreSQL 17+: a failover slot's changes wait for the physical standbys of synchronized_standby_slots to confirm the WAL, with no progress for this long). 0 when it does not. Past OUTBOX_STALL_TIMEOUT, /healthz fails and says what for.",
	}, []string{"for"})
	m.WalsenderHeldBy = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "outbox_connector_walsender_held_by",
		Help: "1 for each thing PostgreSQL holds the session's replication connection for (outbox_connector_walsender_held_seconds): a transaction slot creation waits for (by=\"prepared:<gid>\" or \"pid:<pid>\", at most 10) or a standby slot of synchronized_standby_slots (by=\"slot:<name>\").",
	}, []string{"for", "by"})
	r.MustRegister(m.WalsenderHeld, m.WalsenderHeldBy)
	r.MustRegister(m.Published, m.DeadLettered, m.Ignored, m.Refused, m.StatusUpdates, m.StreamSilent, m.Reconnects,
		m.CommitToAck, m.LeaseToken, m.Takeovers, m.SnapshotEvents, m.SlotRecoveries, m.KafkaTxns, m.KafkaTxnCommit,
		m.KafkaRefused, m.TopicMissing, m.OrderViolations, m.KafkaDataLoss,
		m.ExactlyOnceSkipped, m.ExactlyOnceSkippedLast, m.RouteRetries, m.PollQueries, m.PollRows, m.PollBuckets)
	return m
}

// GaugeFunc registers a gauge computed at scrape time.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}
