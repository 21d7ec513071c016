package collect

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// row is one result row in PostgreSQL's text format, column name to value,
// nil for NULL. Every query runs with the simple protocol, so results arrive
// as text whatever their type (pg_lsn and xid have no pgx codec), exactly as
// psql shows them: the rows recorded under testdata/ have the same form.
type row map[string]*string

// querier is what the views need from a connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func queryRows(ctx context.Context, q querier, sql string) ([]row, error) {
	// The simple protocol also avoids prepared statements, whose cache would
	// outlive a server restart or a version change behind the same address.
	rows, err := q.Query(ctx, sql, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	fds := rows.FieldDescriptions()
	var out []row
	for rows.Next() {
		raw := rows.RawValues()
		r := make(row, len(fds))
		for i, fd := range fds {
			if raw[i] == nil {
				r[fd.Name] = nil
				continue
			}
			s := string(raw[i])
			r[fd.Name] = &s
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// parser reads typed values out of a row, collecting every malformed value
// instead of stopping at the first.
type parser struct {
	r    row
	errs []error
}

func (p *parser) value(col string) (string, bool) {
	v, ok := p.r[col]
	if !ok || v == nil {
		return "", false
	}
	return *v, true
}

func (p *parser) fail(col, v, want string) {
	p.errs = append(p.errs, fmt.Errorf("column %s: %q is not %s", col, v, want))
}

func (p *parser) str(col string) string {
	v, _ := p.value(col)
	return v
}

func (p *parser) boolean(col string) bool {
	b := p.optBool(col)
	return b != nil && *b
}

func (p *parser) optBool(col string) *bool {
	v, ok := p.value(col)
	if !ok {
		return nil
	}
	switch v {
	case "t", "true":
		t := true
		return &t
	case "f", "false":
		f := false
		return &f
	}
	p.fail(col, v, "a boolean")
	return nil
}

func (p *parser) int64(col string) *int64 {
	v, ok := p.value(col)
	if !ok {
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		p.fail(col, v, "an integer")
		return nil
	}
	return &n
}

func (p *parser) float(col string) *float64 {
	v, ok := p.value(col)
	if !ok {
		return nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		p.fail(col, v, "a number")
		return nil
	}
	return &f
}

func (p *parser) lsn(col string) LSN {
	v, ok := p.value(col)
	if !ok {
		return 0
	}
	l, err := ParseLSN(v)
	if err != nil {
		p.fail(col, v, "an LSN")
	}
	return l
}

func (p *parser) err() error { return errors.Join(p.errs...) }
