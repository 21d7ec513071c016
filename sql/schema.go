// Package schema holds the schema files of sql/ for the code that creates
// a table when a deployment did not apply them (and its role may create it):
// the connector's state and lease tables are defined once, in
// 004_connector_state.sql, and the connector runs that file's statements.
package schema

import (
	_ "embed"
	"fmt"
	"strings"
)

//go:embed 004_connector_state.sql
var connectorState string

// Statements are the statements of 004_connector_state.sql that create or
// alter table (schema-qualified, as the file names it), in the file's order.
// It panics when there is none: the file and the code disagree.
func Statements(table string) []string {
	var out []string
	for _, s := range split(connectorState) {
		if strings.Contains(s, "TABLE IF NOT EXISTS "+table+" ") || strings.Contains(s, "ALTER TABLE "+table+" ") {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		panic(fmt.Sprintf("sql/004_connector_state.sql defines no table %s", table))
	}
	return out
}

// split cuts a file of plain statements (no function bodies, no string
// holding a semicolon) into statements, without comment lines.
func split(file string) []string {
	var out []string
	var b strings.Builder
	for _, line := range strings.Split(file, "\n") {
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		b.WriteString(line)
		b.WriteString("\n")
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(b.String()), ";"))
			b.Reset()
		}
	}
	if strings.TrimSpace(b.String()) != "" {
		out = append(out, strings.TrimSpace(b.String()))
	}
	return out
}
