package collect

import (
	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/pgoutbox/internal/pglsn"
)

// LSN is a WAL position (pg_lsn), bytes since the start of WAL. The zero
// LSN is PostgreSQL's InvalidXLogRecPtr, which slotwatch also uses for NULL.
type LSN uint64

// ParseLSN parses PostgreSQL's text form, "16/B374D848" (strictly: see
// pglsn.Parse).
func ParseLSN(s string) (LSN, error) {
	l, err := pglsn.Parse(s)
	return LSN(l), err
}

// String formats the LSN as PostgreSQL does.
func (l LSN) String() string { return pglogrepl.LSN(l).String() }

// MarshalText makes LSNs readable in JSON.
func (l LSN) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText parses the text form.
func (l *LSN) UnmarshalText(b []byte) error {
	v, err := ParseLSN(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// Diff is a minus b in bytes (pg_wal_lsn_diff), negative when b is ahead.
func Diff(a, b LSN) int64 { return int64(a) - int64(b) }
