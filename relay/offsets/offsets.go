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
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

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

// offsetsSegmentBytes is the offsets topic's segment size.
const offsetsSegmentBytes = 100 << 20

// createdVisible bounds the wait for a topic Ensure created to be known.
const createdVisible = 30 * time.Second

// Ensure makes sure the offsets topic exists: created with one partition
// (a slot's newest position is read back from the end at every session
// start, and one partition keeps that one read), cleanup.policy=compact
// with 100 MiB segments, and the
// replication factor of the event topics. With create false it must exist.
// An existing topic that is not compacted is refused: its positions would
// be deleted by retention, and a start would then find them missing.
func Ensure(ctx context.Context, adm *kadm.Client, topic string, create bool, replication int16) error {
	if create {
		// Segments of 100 MiB, as __consumer_offsets has: only closed
		// segments are compacted, and a segment of the broker's default
		// 1 GiB would hold days of positions at a hundred commits a second.
		resp, err := adm.CreateTopic(ctx, 1, replication, map[string]*string{
			"cleanup.policy": kadm.StringPtr("compact"),
			"segment.bytes":  kadm.StringPtr(strconv.Itoa(offsetsSegmentBytes)),
		}, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create the exactly-once offsets topic %q (OUTBOX_KAFKA_OFFSETS_TOPIC): %w", topic, err)
		}
	}
	// A topic just created may be unknown for a moment to the broker that
	// answers the describe (its metadata follows the controller's):
	// created by us, it exists, so an unknown topic is waited for.
	wait := retry.New(100*time.Millisecond, time.Second)
	var rc kadm.ResourceConfig
	for deadline := time.Now().Add(createdVisible); ; {
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			return fmt.Errorf("describe the exactly-once offsets topic %q: %w", topic, err)
		}
		rc, err = rcs.On(topic, nil)
		if err == nil {
			err = rc.Err
		}
		if err == nil {
			break
		}
		if !errors.Is(err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("describe the exactly-once offsets topic %q: %w", topic, err)
		}
		if !create {
			return &MissingError{Topic: topic}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the exactly-once offsets topic %q was created but is still unknown to the broker after %s: %w", topic, createdVisible, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("describe the exactly-once offsets topic %q: %w", topic, ctx.Err())
		case <-time.After(wait.NextBackOff()):
		}
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

// Load reads the newest committed position of key from topic. It first
// writes a barrier, a record of its own under the key's barrier key, and
// then reads the partition read_committed back from that barrier, by
// windows that double, until a window holds a record under the key (or
// the partition's start is reached): a read_committed fetch returns the barrier only once every
// transaction open before it has ended (the previous producer's were ended
// by InitProducerID; another slot's sharing the topic ends within its
// transaction timeout), so a position committed last is never missed for an
// older one, however the partition ends (a transaction marker, or records
// compaction removed). Kafka Connect reads its offsets to the end offsets
// it listed, which a partition ending in markers makes a guess; the barrier
// is exact, and compaction keeps one per slot.
//
// ok is false when the topic holds no position of key (or a tombstone).
// A position that cannot be read is a *CorruptError.
func Load(ctx context.Context, conn []kgo.Opt, topic string, key Key) (p Position, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	cl, err := kgo.NewClient(append(conn, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return p, false, fmt.Errorf("read the exactly-once position: %w", err)
	}
	defer cl.Close()
	nonce := strconv.FormatInt(time.Now().UnixNano(), 10)
	barrier := key.barrier()
	res := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Key: barrier, Value: []byte(nonce)})
	if err := res.FirstErr(); err != nil {
		return p, false, fmt.Errorf("write the read barrier to the exactly-once offsets topic %q: %w", topic, err)
	}
	at := res[0].Record.Offset
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return p, false, fmt.Errorf("list the start of the exactly-once offsets topic %q: %w", topic, err)
	}
	start := int64(0)
	if o, found := starts.Lookup(topic, 0); found {
		start = o.Offset
	}
	// The newest record under the key is the position, so the partition
	// is read backwards by windows from the barrier: the last window that
	// holds one decides. Each Kafka transaction adds two offsets (its
	// position and its marker), and the active segment is never compacted,
	// so reading from the start would read every commit since the segment
	// began (gigabytes at a hundred commits a second) at every session
	// start.
	until := at
	for window := int64(loadWindow); ; window *= 2 {
		from := max(start, until-window)
		p, ok, found, err := loadRange(ctx, conn, topic, key, from, until)
		if err != nil || found || from == start {
			return p, ok, err
		}
		until = from
	}
}

// recordsRead counts the records Load examined (for its tests).
var recordsRead atomic.Int64

// loadWindow is the first window Load reads back from the barrier, in
// offsets: the last few hundred commits of the slots sharing the topic.
const loadWindow = 1024

// loadRange reads offsets [from, until) of the offsets topic's partition
// read_committed, and returns the newest record under key among them:
// found says there is one (a position, ok, or a tombstone). until is a
// barrier's offset or an offset before it, so every transaction open
// before it has ended by the time a read reaches it.
func loadRange(ctx context.Context, conn []kgo.Opt, topic string, key Key, from, until int64) (p Position, ok, found bool, err error) {
	rd, err := kgo.NewClient(append(conn,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		return p, false, false, fmt.Errorf("read the exactly-once position: %w", err)
	}
	defer rd.Close()
	want := key.Bytes()
	var lastErr error
	for {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			return Position{}, false, false, fmt.Errorf("read the exactly-once position from %q, offsets %d to %d, within %s (a transaction left open in the topic holds read_committed readers back: kafka-transactions.sh find-hanging; last fetch error: %v): %w", topic, from, until, loadTimeout, lastErr, ctx.Err())
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			if !kerr.IsRetriable(ferr) {
				return Position{}, false, false, fmt.Errorf("read the exactly-once position from %q: %w", topic, ferr)
			}
			lastErr = ferr
		}
		done := false
		var perr error
		fs.EachRecord(func(r *kgo.Record) {
			if done {
				return
			}
			recordsRead.Add(1)
			if r.Offset >= until {
				done = true
				return
			}
			if !bytes.Equal(r.Key, want) {
				return
			}
			found = true
			if r.Value == nil {
				// A tombstone: someone deleted the position.
				p, ok, perr = Position{}, false, nil
				return
			}
			q, err := Parse(r.Value)
			if err != nil {
				perr = &CorruptError{Topic: topic, Offset: r.Offset, Err: err}
				return
			}
			p, ok, perr = q, true, nil
		})
		if done {
			if perr != nil {
				return Position{}, false, true, perr
			}
			return p, ok, found, nil
		}
	}
}

// loadTimeout bounds Load.
const loadTimeout = 2 * time.Minute

// barrier is the key of the slot's read barriers.
func (k Key) barrier() []byte {
	return append(append([]byte(`{"barrier":`), k.Bytes()...), '}')
}

// CorruptError: the newest record under the slot's key is no position this
// connector can read.
type CorruptError struct {
	Topic  string
	Offset int64
	Err    error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("the exactly-once offsets topic %q holds at offset %d, under this slot's key, a record this connector cannot read (%v): written by another program or a newer connector; remove it (produce a tombstone under the key) and start with OUTBOX_ON_OFFSETS_LOSS=at-least-once, or run the connector that wrote it", e.Topic, e.Offset, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }
