package wal

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/route"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// outboxColumns are benchRelation's columns: the outbox's.
var outboxColumns = []RelationColumn{
	{Name: "id", Type: 2950}, {Name: "aggregatetype", Type: 1043}, {Name: "aggregateid", Type: 1043},
	{Name: "type", Type: 1043}, {Name: "payload", Type: 3802}, {Name: "created_at", Type: 1184},
}

// relationWith is a Relation message with the columns cols.
func relationWith(id uint32, namespace, name string, cols []RelationColumn) []byte {
	b := wire(byte(msgRelation), id, cstr(namespace), cstr(name), byte('d'), uint16(len(cols)))
	for _, c := range cols {
		b = wire(b, byte(0), cstr(c.Name), c.Type, uint32(0xffffffff))
	}
	return b
}

// TestStreamRefusesFormerPartitionInsert: an insert into a relation that
// is not a partition of the outbox now (IsOutboxPartition says no: it was
// detached or dropped after the insert was written) but has the columns
// the connector reads from the partitioned outbox (RoutingColumns), in any
// order and whatever else it has, stops the stream with a fatal.Error naming
// it, before the row is handed on, and nothing of its transaction is acked;
// a relation without one of them is another table,
// and so is any relation when the outbox is not partitioned (OutboxColumns
// gives none). A failed column lookup is a retryable error, nothing acked.
func TestStreamRefusesFormerPartitionInsert(t *testing.T) {
	const start, final = 500, 5000
	begin, commit := benchBegin(final), benchCommit(final, final+40)
	reversed := make([]RelationColumn, len(outboxColumns))
	for i, c := range outboxColumns {
		reversed[len(outboxColumns)-1-i] = c
	}
	withCols := func(g *guardStream, cols []RelationColumn, err error) *int {
		asked := new(int)
		g.OutboxColumns = func(context.Context) ([]RelationColumn, error) {
			*asked++
			return cols, err
		}
		return asked
	}
	refused := func(t *testing.T, g *guardStream, err error) {
		t.Helper()
		var fe *fatal.Error
		if !errors.As(err, &fe) {
			t.Fatalf("insert into a former partition of the outbox: %v; want a fatal.Error", err)
		}
		for _, want := range []string{"public.outbox_p20261201", "not a partition of the partitioned outbox table public.outbox now", "publish_via_partition_root = true", FormatLSN(final)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		if n := len(g.out); n != 0 {
			t.Errorf("%d events handed on; want none", n)
		}
		g.Tracker.ServerWALEnd(final + 1000)
		if p := g.Tracker.Positions(); p.Acked != start {
			t.Errorf("acked %d after the refusal; want %d", p.Acked, start)
		}
		if g.ignored["other-table"] != 0 {
			t.Errorf("the former partition's insert was counted as another table's")
		}
	}

	t.Run("detached or dropped partition", func(t *testing.T) {
		g := newGuardStream(t, start, nil, nil)
		withCols(g, outboxColumns, nil)
		refused(t, g, g.feed(begin, relationMsg(partRelID, "public", "outbox_p20261201"), insertMsg(partRelID)))
	})

	t.Run("columns in another order", func(t *testing.T) {
		g := newGuardStream(t, start, nil, nil)
		withCols(g, outboxColumns, nil)
		refused(t, g, g.feed(begin, relationWith(partRelID, "public", "outbox_p20261201", reversed), insertMsg(partRelID)))
	})

	// The outbox's columns may have changed since the insert was written
	// (ALTER TABLE outbox ADD COLUMN after the partition was detached): the
	// Relation message has the columns of then, OutboxColumns today's. A
	// relation with the columns the connector reads (the routing columns)
	// is refused whatever else it has.
	t.Run("routing columns, not today's columns", func(t *testing.T) {
		for name, cols := range map[string][]RelationColumn{
			"outbox gained a column since": outboxColumns[:5],
			"outbox lost a column since":   append(append([]RelationColumn{}, outboxColumns...), RelationColumn{Name: "archived_at", Type: 1184}),
			"another type":                 append(append([]RelationColumn{}, outboxColumns[:5]...), RelationColumn{Name: "created_at", Type: 1114}),
			"a name twice":                 append(append([]RelationColumn{}, outboxColumns[:5]...), RelationColumn{Name: "id", Type: 2950}),
			"no type (not read)":           append(append([]RelationColumn{}, outboxColumns[:3]...), outboxColumns[4:]...),
		} {
			t.Run(name, func(t *testing.T) {
				g := newGuardStream(t, start, nil, nil)
				withCols(g, outboxColumns, nil)
				refused(t, g, g.feed(begin, relationWith(partRelID, "public", "outbox_p20261201", cols), insertMsg(partRelID)))
			})
		}
	})

	t.Run("configured routing columns", func(t *testing.T) {
		rc := route.DefaultConfig()
		rc.FieldEventID, rc.FieldEventKey = "event_id", ""
		routing := RoutingColumns(rc)
		if want := []string{"event_id", "aggregatetype", "payload"}; !slices.Equal(routing, want) {
			t.Fatalf("RoutingColumns = %q; want %q (no key column configured, type not read)", routing, want)
		}
		if got, want := RoutingColumns(route.DefaultConfig()), []string{"id", "aggregatetype", "aggregateid", "payload"}; !slices.Equal(got, want) {
			t.Fatalf("RoutingColumns(default) = %q; want %q", got, want)
		}
		renamed := append([]RelationColumn{{Name: "event_id", Type: 2950}}, outboxColumns[1:]...)
		g := newGuardStream(t, start, nil, nil)
		withCols(g, renamed, nil)
		g.RoutingColumns = routing
		refused(t, g, g.feed(begin, relationWith(partRelID, "public", "outbox_p20261201", renamed[:5]), insertMsg(partRelID)))

		g = newGuardStream(t, start, nil, nil)
		withCols(g, renamed, nil)
		g.RoutingColumns = routing
		if err := g.feed(begin, relationWith(otherRelID, "public", "orders", outboxColumns), insertMsg(otherRelID), commit); err != nil {
			t.Fatalf("a table without the configured id column: %v; want another table's insert", err)
		}
		if g.ignored["other-table"] != 1 {
			t.Errorf("other-table counted %d; want 1", g.ignored["other-table"])
		}
	})

	t.Run("another table's columns", func(t *testing.T) {
		without := func(name string) []RelationColumn {
			var cols []RelationColumn
			for _, c := range outboxColumns {
				if c.Name != name {
					cols = append(cols, c)
				}
			}
			return cols
		}
		for name, cols := range map[string][]RelationColumn{
			"no id":            without("id"),
			"no aggregatetype": without("aggregatetype"),
			"no aggregateid":   without("aggregateid"),
			"no payload":       without("payload"),
			"no columns":       nil,
		} {
			t.Run(name, func(t *testing.T) {
				g := newGuardStream(t, start, nil, nil)
				asked := withCols(g, outboxColumns, nil)
				rel := relationWith(otherRelID, "public", "orders", cols)
				if err := g.feed(begin, rel, insertMsg(otherRelID), insertMsg(otherRelID), commit); err != nil {
					t.Fatalf("another table's inserts: %v", err)
				}
				if g.ignored["other-table"] != 2 || len(g.out) != 0 {
					t.Errorf("other-table counted %d, %d events handed on; want 2 and 0", g.ignored["other-table"], len(g.out))
				}
				if *asked != 1 {
					t.Errorf("outbox columns asked %d times; want once per Relation message", *asked)
				}
				if got := g.Tracker.Acked(); got != final+40 {
					t.Errorf("acked %d; want the commit's end %d", got, final+40)
				}
			})
		}
	})

	t.Run("plain outbox", func(t *testing.T) {
		g := newGuardStream(t, start, nil, nil)
		withCols(g, nil, nil)
		if err := g.feed(begin, relationMsg(otherRelID, "public", "outbox_archive"), insertMsg(otherRelID), commit); err != nil {
			t.Fatalf("a table with the columns of a plain outbox: %v; want another table's insert", err)
		}
		if g.ignored["other-table"] != 1 {
			t.Errorf("other-table counted %d; want 1", g.ignored["other-table"])
		}
	})

	t.Run("a partition now is not asked about its columns", func(t *testing.T) {
		g := newGuardStream(t, start, map[uint32]bool{partRelID: true}, nil)
		asked := withCols(g, outboxColumns, nil)
		err := g.feed(begin, relationMsg(partRelID, "public", "outbox_p20261201"), insertMsg(partRelID))
		if !fatal.Is(err) || !strings.Contains(err.Error(), "a partition of the outbox table public.outbox") {
			t.Fatalf("insert into a partition: %v; want the partition's fatal.Error", err)
		}
		if *asked != 0 {
			t.Errorf("outbox columns asked %d times for a partition; want 0", *asked)
		}
	})

	t.Run("column lookup fails", func(t *testing.T) {
		g := newGuardStream(t, start, nil, nil)
		withCols(g, nil, errors.New("connection refused"))
		err := g.feed(begin, relationMsg(otherRelID, "public", "orders"), insertMsg(otherRelID))
		if err == nil || fatal.Is(err) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("failed lookup: %v; want a retryable error that wraps the cause", err)
		}
		g.Tracker.ServerWALEnd(final + 1000)
		if got := g.Tracker.Acked(); got != start {
			t.Fatalf("acked %d after a failed lookup; want %d", got, start)
		}
		if g.ignored["other-table"] != 0 {
			t.Errorf("an insert not known to be another table's was counted as one")
		}
	})
}
