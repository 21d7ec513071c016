// Package redrive re-publishes dead letters once their cause is fixed (a
// router setting, a topic, a larger message limit): from the
// outbox_dead_letter table, deleting each row once Kafka acked its record,
// or from the DLQ topic, committing the consumer group's offset once the
// record is acked so that a second run does not repeat it. A dead letter
// that still cannot be routed or published stays where it is, and is
// reported.
package redrive

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pglsn"
	"github.com/pgoutbox/pgoutbox/route"
)

// Result counts what a run did.
type Result struct {
	Published int
	Failed    int
}

// Redriver publishes rebuilt rows with a router and a producer client.
type Redriver struct {
	Router          *route.Router
	Client          *kgo.Client
	MaxMessageBytes int
	// Headers are added to every record (the lease token).
	Headers []kgo.RecordHeader
	Log     *slog.Logger
}

// publish routes row and produces it synchronously.
func (r *Redriver) publish(ctx context.Context, row *route.Row) error {
	rec, err := r.Router.Route(ctx, row)
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	rec.Headers = append(rec.Headers, r.Headers...)
	if n := len(rec.Key) + len(rec.Value); r.MaxMessageBytes > 0 && n > r.MaxMessageBytes {
		return fmt.Errorf("record of %d bytes is still over OUTBOX_KAFKA_MAX_MESSAGE_BYTES=%d", n, r.MaxMessageBytes)
	}
	if err := ensureTopic(ctx, r.Client, rec.Topic); err != nil {
		return err
	}
	return r.Client.ProduceSync(ctx, rec).FirstErr()
}

func ensureTopic(ctx context.Context, cl *kgo.Client, topic string) error {
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, -1, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create topic %q: %w", topic, err)
	}
	return nil
}

// rowFrom rebuilds a row from a JSON object of column values and a JSON
// object of column type OIDs. A value is its text, null, or, for one that
// PostgreSQL text cannot hold (a NUL byte, bytes that are not UTF-8), the
// {"base64": ...} object the connector stores it as.
func rowFrom(values, types []byte) (*route.Row, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(values, &raw); err != nil {
		return nil, fmt.Errorf("dead letter value is not a JSON object of columns: %w", err)
	}
	vals := make(map[string]*string, len(raw))
	for name, r := range raw {
		v, err := columnValue(r)
		if err != nil {
			return nil, fmt.Errorf("dead letter column %q: %w", name, err)
		}
		vals[name] = v
	}
	oids := map[string]uint32{}
	if len(types) > 0 {
		if err := json.Unmarshal(types, &oids); err != nil {
			return nil, fmt.Errorf("dead letter column types: %w", err)
		}
	}
	row := &route.Row{}
	for name, v := range vals {
		c := route.Column{Name: name, Type: route.OIDText}
		if t, ok := oids[name]; ok {
			c.Type = t
		}
		if v == nil {
			c.Null = true
		} else {
			c.Value = []byte(*v)
		}
		row.Columns = append(row.Columns, c)
	}
	return row, nil
}

// columnValue reads one value of row_data: a string, null, or
// {"base64": "<its bytes>"}.
func columnValue(r json.RawMessage) (*string, error) {
	var s *string
	if err := json.Unmarshal(r, &s); err == nil {
		return s, nil
	}
	var b struct {
		Base64 *string `json:"base64"`
	}
	if err := json.Unmarshal(r, &b); err != nil || b.Base64 == nil {
		return nil, fmt.Errorf("value %s is neither text, null nor {\"base64\": ...}", r)
	}
	v, err := base64.StdEncoding.DecodeString(*b.Base64)
	if err != nil {
		return nil, fmt.Errorf("base64 value: %w", err)
	}
	out := string(v)
	return &out, nil
}

const selectDeadLetters = `
SELECT id, row_data::text, coalesce(column_types::text, ''), coalesce(source_lsn::text, '0/0')
FROM public.outbox_dead_letter ORDER BY created_at, id`

// FromTable re-publishes every row of outbox_dead_letter, deleting each
// once Kafka acked it.
func (r *Redriver) FromTable(ctx context.Context, pool *pgxpool.Pool) (Result, error) {
	var res Result
	rows, err := pool.Query(ctx, selectDeadLetters)
	if err != nil {
		return res, fmt.Errorf("read outbox_dead_letter: %w", err)
	}
	type dl struct{ id, data, types, lsn string }
	var all []dl
	for rows.Next() {
		var d dl
		if err := rows.Scan(&d.id, &d.data, &d.types, &d.lsn); err != nil {
			rows.Close()
			return res, err
		}
		all = append(all, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, err
	}
	for _, d := range all {
		row, err := rowFrom([]byte(d.data), []byte(d.types))
		if err == nil {
			row.Source.LSN = parseLSN(d.lsn)
			err = r.publish(ctx, row)
		}
		if err != nil {
			res.Failed++
			r.Log.Warn("dead letter still cannot be published; kept", "id", d.id, "err", err)
			continue
		}
		if _, err := pool.Exec(ctx, `DELETE FROM public.outbox_dead_letter WHERE id = $1`, d.id); err != nil {
			return res, fmt.Errorf("delete redriven dead letter %s: %w", d.id, err)
		}
		res.Published++
		r.Log.Info("redrove a dead letter from the table", "id", d.id)
	}
	return res, nil
}

// FromTopic re-publishes the DLQ topic's records from the consumer group's
// committed offsets up to the end offsets found at start, committing each
// partition's offset as it goes. A record that still fails is reported and
// stops that partition there (so a later run retries it, in order).
func (r *Redriver) FromTopic(ctx context.Context, opts []kgo.Opt, topic, group string) (Result, error) {
	var res Result
	cl, err := kgo.NewClient(append(opts, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// The connector writes the DLQ topic in Kafka transactions: a
		// partition's last offset is often a transaction marker, which
		// the loop below must see to know it reached the end.
		kgo.KeepControlRecords())...)
	if err != nil {
		return res, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return res, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	// A new group's coordinator (and __consumer_offsets itself, on a new
	// cluster) may take a moment to exist: retry what Kafka says is retriable.
	var committed kadm.OffsetResponses
	for attempt := 0; ; attempt++ {
		committed, err = adm.FetchOffsets(ctx, group)
		if err == nil || !kerr.IsRetriable(err) || attempt == 50 {
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err != nil {
		return res, fmt.Errorf("fetch offsets of group %s: %w", group, err)
	}
	remaining := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		start := int64(0)
		if c, ok := committed.Lookup(topic, o.Partition); ok && c.At >= 0 {
			start = c.At
		}
		if o.Offset > start {
			remaining[o.Partition] = o.Offset
		}
	})
	stopped := map[int32]bool{}
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := fs.Err0(); err != nil {
			return res, fmt.Errorf("consume %s: %w", topic, err)
		}
		fs.EachRecord(func(rec *kgo.Record) {
			end, ok := remaining[rec.Partition]
			if !ok || stopped[rec.Partition] {
				return
			}
			if rec.Attrs.IsControl() {
				if rec.Offset+1 >= end {
					delete(remaining, rec.Partition)
				}
				return
			}
			row, err := rowFrom(rec.Value, []byte(inbox.Header(rec, "column.types")))
			if err == nil {
				row.Source.LSN = parseLSN(inbox.Header(rec, "source.lsn"))
				err = r.publish(ctx, row)
			}
			if err != nil {
				res.Failed++
				stopped[rec.Partition] = true
				delete(remaining, rec.Partition)
				r.Log.Warn("dead letter still cannot be published; stopping this partition here", "id", inbox.Header(rec, "id"), "partition", rec.Partition, "offset", rec.Offset, "err", err)
				return
			}
			res.Published++
			if err := cl.CommitRecords(ctx, rec); err != nil {
				r.Log.Warn("commit redrive offset", "err", err)
			}
			if rec.Offset+1 >= end {
				delete(remaining, rec.Partition)
			}
		})
	}
	return res, nil
}

func parseLSN(s string) uint64 {
	l, err := pglsn.Parse(s)
	if err != nil {
		return 0
	}
	return uint64(l)
}
