package wal

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/route"
)

// queryColumnInfo reads, for relation $1, each column's NOT NULL flag and
// default expression, as Debezium reads them to build a table's schema
// (a column's field is required when NOT NULL, with the default as the
// schema's default value). Generated columns are left out: pgoutput does
// not send them.
const queryColumnInfo = `
SELECT a.attname::text, a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''`

// ColumnInfoOf returns a Stream.ColumnInfo that asks q, a normal (not
// replication) connection or pool, for the columns of a relation. It
// reads the catalog as it is now, as Debezium does when it refreshes a
// table's schema.
func ColumnInfoOf(q Querier) func(ctx context.Context, relID uint32) (map[string]*route.ColumnInfo, error) {
	return func(ctx context.Context, relID uint32) (map[string]*route.ColumnInfo, error) {
		ctx, cancel := context.WithTimeout(ctx, partitionLookupTimeout)
		defer cancel()
		rows, err := q.Query(ctx, queryColumnInfo, relID)
		if err != nil {
			return nil, fmt.Errorf("read the columns of relation %d (NOT NULL, defaults): %w", relID, err)
		}
		defer rows.Close()
		out := map[string]*route.ColumnInfo{}
		for rows.Next() {
			var name string
			var notNull bool
			var def *string
			if err := rows.Scan(&name, &notNull, &def); err != nil {
				return nil, fmt.Errorf("read the columns of relation %d (NOT NULL, defaults): %w", relID, err)
			}
			info := &route.ColumnInfo{NotNull: notNull}
			if def != nil {
				info.Default, info.HasDefault = *def, true
			}
			out[name] = info
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read the columns of relation %d (NOT NULL, defaults): %w", relID, err)
		}
		return out, nil
	}
}

// columnInfo aligns what ColumnInfo says of rel with its columns, once per
// Relation message; a column the catalog does not have now (dropped since
// the insert) has none.
func (s *Stream) columnInfo(ctx context.Context, rel *relation) error {
	if s.ColumnInfo == nil || rel.infoRead {
		return nil
	}
	byName, err := s.ColumnInfo(ctx, rel.ID)
	if err != nil {
		return fmt.Errorf("%s.%s: %w", rel.Namespace, rel.Name, err)
	}
	rel.info = make([]*route.ColumnInfo, len(rel.Columns))
	for i, c := range rel.Columns {
		rel.info[i] = byName[c.Name]
	}
	rel.infoRead = true
	return nil
}

// TextRow builds a row from a query's result read in text format (the
// simple protocol), as pgoutput sends values, so that it routes exactly
// like a streamed one: fields is the result's description (which carries
// each column's atttypmod, as pgoutput's Relation message does), raw a
// row's values (copied), infos ColumnInfoOf's answer for the table.
func TextRow(fields []pgconn.FieldDescription, raw [][]byte, infos map[string]*route.ColumnInfo, src route.Source) *route.Row {
	row := &route.Row{Columns: make([]route.Column, len(fields)), Source: src}
	for i, f := range fields {
		c := &row.Columns[i]
		c.Name, c.Type, c.TypeMod, c.HasTypeMod = f.Name, f.DataTypeOID, f.TypeModifier, true
		c.Info = infos[f.Name]
		if raw[i] == nil {
			c.Null = true
		} else {
			c.Value = append([]byte(nil), raw[i]...)
		}
	}
	return row
}
