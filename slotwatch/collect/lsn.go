package collect

import (
	"fmt"
	"strconv"
	"strings"
)

// LSN is a WAL position (pg_lsn), bytes since the start of WAL. The zero
// LSN is PostgreSQL's InvalidXLogRecPtr, which slotwatch also uses for NULL.
type LSN uint64

// ParseLSN parses PostgreSQL's text form, "16/B374D848".
func ParseLSN(s string) (LSN, error) {
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
	return LSN(h<<32 | l), nil
}

// String formats the LSN as PostgreSQL does.
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint64(l)>>32, uint64(l)&0xFFFFFFFF) }

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
