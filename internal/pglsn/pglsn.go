// Package pglsn reads PostgreSQL's text form of a WAL position strictly,
// as pglogrepl.LSN. Formatting is pglogrepl.LSN's String.
package pglsn

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Parse reads "X/Y", each half hexadecimal of at most 32 bits, as pg_lsn
// prints it ("16/B374D848").
//
// pglogrepl.ParseLSN is not used: it reads with fmt.Sscanf, which takes a
// lower half over 32 bits ("1/100000000" is 2/0) and ignores what follows
// ("1/2x" is 1/2). A position read wrong is a position confirmed or
// reported wrong, so a malformed one is an error.
func Parse(s string) (pglogrepl.LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("LSN %q: want X/Y in hexadecimal", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	return pglogrepl.LSN(h<<32 | l), nil
}
