package publish

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// storedColumns decodes a dead letter's row_data: a column's text, or the
// bytes of a value text cannot hold ({"base64": ...}); nil for SQL NULL.
func storedColumns(t testing.TB, data []byte) map[string][]byte {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("row_data %s: %v", data, err)
	}
	out := map[string][]byte{}
	for name, v := range raw {
		switch {
		case string(v) == "null":
			out[name] = nil
		case strings.HasPrefix(string(v), `"`):
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				t.Fatal(err)
			}
			out[name] = []byte(s)
		default:
			var enc struct{ Base64 string }
			if err := json.Unmarshal(v, &enc); err != nil {
				t.Fatalf("row_data column %q: %s: %v", name, v, err)
			}
			b, err := base64.StdEncoding.DecodeString(enc.Base64)
			if err != nil {
				t.Fatalf("row_data column %q: %v", name, err)
			}
			out[name] = b
		}
	}
	return out
}

// TestDeadLetterUnstorableBytes: an event whose dead letter goes to
// outbox_dead_letter and holds what PostgreSQL's text and jsonb cannot
// (a NUL byte, bytes that are not UTF-8: a transactional logical message
// whose content is not JSON, a column of bytea text output cut short) or
// an event id longer than the table's index takes is stored, whole, within
// seconds, and acked: such an insert fails with a data error (SQLSTATE
// 22P05, 22021, 54000) on every try, and retrying it wedged the line. Every
// column's bytes come back exactly from row_data.
func TestDeadLetterUnstorableBytes(t *testing.T) {
	pool := deadLetterPool(t)
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Every record is over the limit: each event goes to the table.
	p := New(Config{MaxMessageBytes: 10}, nil, router, pool, slog.New(slog.NewTextHandler(testWriter{t}, nil)), metrics.New())
	longID := make([]byte, 4000)
	_, _ = rand.Read(longID)
	cases := []struct {
		name string
		ev   func(tx *tracker.Txn) wal.Event
	}{
		{"message content with NUL, not JSON", func(tx *tracker.Txn) wal.Event {
			src := route.Source{LSN: 100, CommitLSN: 200, Message: true}
			row := &route.Row{Source: src, Columns: []route.Column{{Name: "content", Type: route.OIDText, Value: []byte("{\"a\": \"\x00\xff\xfe not json")}}}
			return wal.Event{Txn: tx, Row: row, Err: &route.Error{Class: route.ClassInvalidPayload, Msg: "logical message content is not a JSON object"}}
		}},
		{"text columns with NUL and invalid UTF-8", func(tx *tracker.Txn) wal.Event {
			row := eventRow("id", "ev-\x00-1", "bytes", "agg\x00id", "{\"k\": \"\xc3\x28\"}", 300, 400)
			return wal.Event{Txn: tx, Row: row}
		}},
		{"event id over the index's limit", func(tx *tracker.Txn) wal.Event {
			return wal.Event{Txn: tx, Row: eventRow("id", hex.EncodeToString(longID), "bytes", "a", `{}`, 500, 600)}
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := tracker.New(0)
			end := uint64(1000 * (i + 1))
			tx := tr.Begin(end)
			tx.Add()
			ev := c.ev(tx)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.handle(ctx, ev); err != nil {
				t.Fatalf("dead-lettering the event: %v", err)
			}
			tx.Commit(end)
			if got := tr.Acked(); got != end {
				t.Fatalf("acked %d, want %d: the dead letter is stored and done", got, end)
			}
			var data []byte
			var lsn string
			if err := pool.QueryRow(ctx, `SELECT row_data::text::bytea, source_lsn::text FROM public.outbox_dead_letter WHERE source_lsn = $1::pg_lsn`,
				wal.FormatLSN(ev.Row.Source.LSN)).Scan(&data, &lsn); err != nil {
				t.Fatalf("the dead letter is not in outbox_dead_letter: %v", err)
			}
			got := storedColumns(t, data)
			if len(got) != len(ev.Row.Columns) {
				t.Errorf("row_data holds %d columns, want %d", len(got), len(ev.Row.Columns))
			}
			for _, col := range ev.Row.Columns {
				if v, ok := got[col.Name]; !ok || string(v) != string(col.Value) {
					t.Errorf("column %q: stored %q, want %q", col.Name, v, col.Value)
				}
			}
			// Read again by the next session: a repeat, acked, nothing added.
			tr2 := tracker.New(0)
			tx2 := tr2.Begin(end)
			tx2.Add()
			ev.Txn = tx2
			p2 := New(Config{MaxMessageBytes: 10}, nil, router, pool, slog.New(slog.NewTextHandler(testWriter{t}, nil)), metrics.New())
			if err := p2.handle(ctx, ev); err != nil {
				t.Fatalf("dead-lettering the event again: %v", err)
			}
			tx2.Commit(end)
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM public.outbox_dead_letter WHERE source_lsn = $1::pg_lsn`, wal.FormatLSN(ev.Row.Source.LSN)).Scan(&n); err != nil || n != 1 || tr2.Acked() != end {
				t.Fatalf("after the event was read again: %d rows for it (%v), acked %d; want 1 row, acked %d", n, err, tr2.Acked(), end)
			}
		})
	}
	// A database error that is not the row's (the table is gone) is still
	// retried, not stored elsewhere or skipped.
	if _, err := pool.Exec(context.Background(), `ALTER TABLE public.outbox_dead_letter RENAME TO outbox_dead_letter_away`); err != nil {
		t.Fatal(err)
	}
	tr := tracker.New(0)
	tx := tr.Begin(9000)
	tx.Add()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = p.handle(ctx, wal.Event{Txn: tx, Row: eventRow("id", "ev-away", "bytes", "a", `{}`, 8000, 9000)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with the table missing, the dead letter's write returned %v; want it retried until the context ends", err)
	}
}
