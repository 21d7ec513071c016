// Package offsets holds the connector's exactly-once position: how far into
// the slot's events Kafka holds, written by the producer into a compacted
// topic of the connector's (OUTBOX_KAFKA_OFFSETS_TOPIC) in the same Kafka
// transaction as the records it covers, so that the two commit or abort
// together, and read back (read_committed) when a session starts, after
// InitProducerID fenced the previous producer and aborted its open
// transaction. Kafka Connect's exactly-once source support (KIP-618) keeps
// its offsets so; this position is finer (it can end inside a PostgreSQL
// transaction that spans Kafka transactions), carries the history it is
// valid in (an epoch the state row issues, the timeline), and is read to the
// partition's real end, past the transaction markers, not to a guess.
package offsets

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// DefaultTopic is OUTBOX_KAFKA_OFFSETS_TOPIC's default.
const DefaultTopic = "outbox.connector.offsets"

// Key names a slot among every connector sharing the offsets topic: the
// PostgreSQL cluster (system identifier), the database and the slot.
type Key struct {
	SystemID string `json:"system_id"`
	Database string `json:"database"`
	Slot     string `json:"slot"`
}

// Bytes is the record key: JSON, fields in this order, so that the same
// slot always has the same key (compaction keeps the last record per key).
func (k Key) Bytes() []byte {
	b, _ := json.Marshal(k)
	return b
}

// Position says which of the slot's events are in Kafka: every event of a
// PostgreSQL transaction whose commit LSN is below Commit, and the first
// Events events of the transaction committed at Commit. It is valid only in
// the history it was written in: the state row's Epoch (a new one is issued
// whenever the slot is created again) and the Timeline (after a promotion,
// WAL past the fork is another history).
type Position struct {
	Epoch    int64  `json:"epoch"`
	Timeline int32  `json:"timeline"`
	Commit   uint64 `json:"-"`
	Events   uint32 `json:"events"`
	// Snapshot counts the rows of an initial snapshot published so far
	// when the position was written during one (Commit is then the slot's
	// consistent point, Events 0). Informational: a snapshot taken again
	// reads the table as it is then, so its rows are never skipped.
	Snapshot uint64 `json:"snapshot_rows,omitempty"`
	// Token is the lease token of the leader that wrote it.
	Token int64 `json:"token"`
}

// Covers reports whether the event that is the n-th (from 0) of the
// transaction committed at commit is in Kafka by p.
func (p Position) Covers(commit uint64, n uint32) bool {
	return commit < p.Commit || commit == p.Commit && n < p.Events
}

// Less orders positions: p is before q.
func (p Position) Less(q Position) bool {
	return p.Commit < q.Commit || p.Commit == q.Commit && p.Events < q.Events
}

func (p Position) String() string {
	return fmt.Sprintf("%s+%d (epoch %d, timeline %d)", wal.FormatLSN(p.Commit), p.Events, p.Epoch, p.Timeline)
}

// wire is the record value: LSNs as PostgreSQL writes them, for people
// reading the topic with kafka-console-consumer.
type wire struct {
	Version int    `json:"version"`
	Commit  string `json:"commit_lsn"`
	Position
}

// Value encodes p as the record value.
func (p Position) Value() []byte {
	b, _ := json.Marshal(wire{Version: 1, Commit: wal.FormatLSN(p.Commit), Position: p})
	return b
}

// Parse decodes a record value.
func Parse(b []byte) (Position, error) {
	var w wire
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&w); err != nil {
		return Position{}, fmt.Errorf("decode exactly-once position %q: %w", b, err)
	}
	if w.Version != 1 {
		return Position{}, fmt.Errorf("exactly-once position %q: version %d, this connector reads version 1 (written by a newer connector?)", b, w.Version)
	}
	lsn, err := pglogrepl.ParseLSN(w.Commit)
	if err != nil {
		return Position{}, fmt.Errorf("exactly-once position %q: %w", b, err)
	}
	p := w.Position
	p.Commit = uint64(lsn)
	return p, nil
}

// Record is p's record for key on topic.
func Record(topic string, key Key, p Position) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: key.Bytes(), Value: p.Value(), Partition: 0}
}

// Ensure makes sure the offsets topic exists: created with one partition
// (a slot's positions are read from start to end at every session start,
// and one partition keeps that one read), cleanup.policy=compact, and the
// replication factor of the event topics. With create false it must exist.
// An existing topic that is not compacted is refused: its positions would
// be deleted by retention, and a start would then find them missing.
func Ensure(ctx context.Context, adm *kadm.Client, topic string, create bool, replication int16) error {
	if create {
		resp, err := adm.CreateTopic(ctx, 1, replication, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create the exactly-once offsets topic %q (OUTBOX_KAFKA_OFFSETS_TOPIC): %w", topic, err)
		}
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return fmt.Errorf("describe the exactly-once offsets topic %q: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return &MissingError{Topic: topic}
	}
	if err != nil {
		return fmt.Errorf("describe the exactly-once offsets topic %q: %w", topic, err)
	}
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil && *c.Value != "compact" {
			return &NotCompactedError{Topic: topic, Policy: *c.Value}
		}
	}
	return nil
}

// MissingError: the offsets topic does not exist and the connector may not
// create it.
type MissingError struct{ Topic string }

func (e *MissingError) Error() string {
	return fmt.Sprintf("the exactly-once offsets topic %q does not exist and OUTBOX_TOPIC_CREATE=false: create it with one partition and cleanup.policy=compact (kafka-topics.sh --create --topic %s --partitions 1 --config cleanup.policy=compact), or set OUTBOX_TOPIC_CREATE=true", e.Topic, e.Topic)
}

// NotCompactedError: the offsets topic deletes old records.
type NotCompactedError struct{ Topic, Policy string }

func (e *NotCompactedError) Error() string {
	return fmt.Sprintf("the exactly-once offsets topic %q has cleanup.policy=%s: retention would delete the connector's positions; set it to compact (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact)", e.Topic, e.Policy, e.Topic)
}

// Load reads the newest committed position of key from topic: it reads the
// partition read_committed from its start to its end as it is once every
// transaction open at the call has ended (the previous producer's were
// ended by InitProducerID; another slot's sharing the topic ends within its
// transaction timeout), so a position committed last is never missed for
// an older one. Control records are kept while reading, so that the end is
// reached exactly even when the partition ends with a transaction marker.
// ok is false when the topic holds no position of key.
func Load(ctx context.Context, conn []kgo.Opt, topic string, key Key) (p Position, ok bool, err error) {
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return p, false, fmt.Errorf("read the exactly-once position: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	end, err := stableEnd(ctx, adm, topic)
	if err != nil {
		return p, false, err
	}
	if end.start >= end.end {
		return p, false, nil
	}
	rd, err := kgo.NewClient(append(conn,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(end.start)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords())...)
	if err != nil {
		return p, false, fmt.Errorf("read the exactly-once position: %w", err)
	}
	defer rd.Close()
	want := key.Bytes()
	for {
		pctx, cancel := context.WithTimeout(ctx, idle)
		fs := rd.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return p, false, fmt.Errorf("read the exactly-once position from %q: %w", topic, err)
		}
		if pctx.Err() != nil && fs.NumRecords() == 0 {
			// Nothing more for idle although the end was not seen: its
			// last records were compacted away (a marker in a segment
			// the cleaner rewrote). What was read is the newest the
			// partition holds; at worst it is older than the newest
			// written, which repeats events, never skips one.
			return p, ok, nil
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil && !kerr.IsRetriable(ferr) {
			return p, false, fmt.Errorf("read the exactly-once position from %q: %w", topic, ferr)
		}
		done := false
		var perr error
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end.end-1 {
				done = true
			}
			if r.Attrs.IsControl() || r.Offset >= end.end || !bytes.Equal(r.Key, want) {
				return
			}
			if r.Value == nil {
				// A tombstone: someone deleted the position.
				p, ok = Position{}, false
				return
			}
			q, err := Parse(r.Value)
			if err != nil {
				perr = err
				return
			}
			p, ok = q, true
		})
		if perr != nil {
			return Position{}, false, perr
		}
		if done {
			return p, ok, nil
		}
	}
}

// idle is how long Load waits for a record before it takes what it read
// as all there is.
const idle = 10 * time.Second

type span struct{ start, end int64 }

// stableEnd is the partition's log start and the end every reader must
// reach: the high watermark at the call, once the last stable offset has
// caught up with it (no transaction open at the call is still open).
func stableEnd(ctx context.Context, adm *kadm.Client, topic string) (span, error) {
	get := func(f func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
		lo, err := f(ctx, topic)
		if err == nil {
			err = lo.Error()
		}
		if err != nil {
			return 0, err
		}
		o, ok := lo.Lookup(topic, 0)
		if !ok {
			return 0, fmt.Errorf("no partition 0")
		}
		return o.Offset, o.Err
	}
	start, err := get(adm.ListStartOffsets)
	if err != nil {
		return span{}, fmt.Errorf("list the start of the exactly-once offsets topic %q: %w", topic, err)
	}
	hwm, err := get(adm.ListEndOffsets)
	if err != nil {
		return span{}, fmt.Errorf("list the end of the exactly-once offsets topic %q: %w", topic, err)
	}
	for {
		lso, err := get(adm.ListCommittedOffsets)
		if err != nil {
			return span{}, fmt.Errorf("list the stable end of the exactly-once offsets topic %q: %w", topic, err)
		}
		if lso >= hwm {
			return span{start: start, end: hwm}, nil
		}
		select {
		case <-ctx.Done():
			return span{}, fmt.Errorf("wait for the transactions open in the exactly-once offsets topic %q to end: %w", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
