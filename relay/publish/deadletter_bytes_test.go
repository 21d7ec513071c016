package publish

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// refusingTable answers every dead-letter insert with a PostgreSQL error
// of SQLSTATE code, and keeps the ids it was asked to store.
type refusingTable struct {
	code string
	ids  []string
}

func (r *refusingTable) QueryRow(_ context.Context, _ string, args ...any) pgx.Row {
	r.ids = append(r.ids, args[0].(string))
	return errRow{&pgconn.PgError{Code: r.code, Message: "refused by the test"}}
}

// TestDeadLetterRefusedForItsValues: an insert refused for the row's values
// (SQLSTATE class 22 or 54) is tried once more in the safe form (under the
// event's place in the WAL) and, refused again, stops the connector with a
// fatal.Error naming the event, at once: never retried forever, never
// acked. Other database errors are retried until the context ends.
func TestDeadLetterRefusedForItsValues(t *testing.T) {
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		code  string
		fatal bool
	}{{"22021", true}, {"22P05", true}, {"54000", true}, {"42P01", false}, {"08006", false}, {"2200", false}} {
		t.Run(c.code, func(t *testing.T) {
			db := &refusingTable{code: c.code}
			p := New(Config{MaxMessageBytes: 10}, nil, router, nil, slog.New(slog.NewTextHandler(testWriter{t}, nil)), metrics.New())
			p.pool = db
			tr := tracker.New(0)
			tx := tr.Begin(200)
			tx.Add()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			err := p.handle(ctx, wal.Event{Txn: tx, Row: eventRow("id", "ev-1", "t", "a", `{}`, 100, 200)})
			tx.Commit(200)
			if tr.Acked() != 0 {
				t.Fatalf("acked %d although the dead letter was never stored", tr.Acked())
			}
			if !c.fatal {
				if fatal.Is(err) || ctx.Err() == nil {
					t.Fatalf("SQLSTATE %s: %v after %d tries; want it retried until the context ends", c.code, err, len(db.ids))
				}
				return
			}
			if !fatal.Is(err) || ctx.Err() != nil {
				t.Fatalf("SQLSTATE %s: %v (context %v); want a fatal.Error at once", c.code, err, ctx.Err())
			}
			if want := []string{"ev-1", "lsn:0/C8:0/64:0"}; strings.Join(db.ids, " ") != strings.Join(want, " ") {
				t.Errorf("tried ids %q, want %q: the event id, then the safe form's place in the WAL", db.ids, want)
			}
			if !strings.Contains(err.Error(), "0/64") {
				t.Errorf("the error does not name the event's LSN 0/64: %v", err)
			}
		})
	}
}

// TestDeadLetterValues: a dead letter's row keeps every byte: text as it
// is, the rest base64 in row_data and \xNN-escaped in the text columns; the
// safe form is ASCII throughout and keyed by the event's place.
func TestDeadLetterValues(t *testing.T) {
	row := eventRow("id", "e\x00", "t", "a\xff", `{"k": "é"}`, 100, 200)
	v := deadLetterValuesOf(row, "id", "lsn:x", "topic", errString("bad\x00"), nil)
	if v.id != `e\x00` || *v.aggID != `a\xFF` || *v.payload != `{"k": "é"}` || v.safe {
		t.Errorf("id %q, aggregateid %q, payload %q, safe %v", v.id, *v.aggID, *v.payload, v.safe)
	}
	if want := `{"aggregateid":{"base64":"Yf8="},"aggregatetype":"t","id":{"base64":"ZQA="},"payload":"{\"k\": \"é\"}","type":"T"}`; string(v.data) != want {
		t.Errorf("row_data %s, want %s", v.data, want)
	}
	if !strings.HasPrefix(v.errText, `bad\x00; some values`) {
		t.Errorf("error %q", v.errText)
	}
	plain := deadLetterValuesOf(eventRow("id", "e1", "t", "a", `{}`, 100, 200), "id", "lsn:x", "topic", errString("bad"), nil)
	if plain.errText != "bad" || string(plain.data) != `{"aggregateid":"a","aggregatetype":"t","id":"e1","payload":"{}","type":"T"}` {
		t.Errorf("a row text holds: error %q, row_data %s; want them as they are", plain.errText, plain.data)
	}
	s := deadLetterValuesOf(row, "id", "lsn:x", "tö", errString("bad"), errString("refused"))
	if s.id != "lsn:x" || !s.safe || *s.payload != `{\"k\": \"\u00e9\"}` || s.topic != `t\u00f6` || strings.Contains(string(s.data), `"t"`) {
		t.Errorf("safe form: id %q, payload %q, topic %q, row_data %s", s.id, *s.payload, s.topic, s.data)
	}
	for _, b := range [][]byte{s.data, s.types, []byte(s.errText)} {
		for _, c := range b {
			if c >= 0x80 || c == 0 {
				t.Fatalf("safe form holds a byte %#x that is not ASCII: %q", c, b)
			}
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }
