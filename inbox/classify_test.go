package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"
)

func pgErr(code string) error {
	return fmt.Errorf("insert processed id: %w", &pgconn.PgError{Code: code, Message: "test"})
}

// TestClassifyOwn: the inbox's own statements fail for the record on the
// record-class SQLSTATEs and a COMMIT that rolled back, for the database on
// everything else.
func TestClassifyOwn(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want fault
	}{
		{"NUL byte or bad UTF-8", pgErr("22021"), faultRecord},
		{"value too long", pgErr("22001"), faultRecord},
		{"deferred unique violation at commit", pgErr("23505"), faultRecord},
		{"undefined column", pgErr("42703"), faultRecord},
		{"index row too large", pgErr("54000"), faultRecord},
		{"commit answered rollback", fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback), faultRecord},
		{"handler closed the transaction", fmt.Errorf("commit: %w", pgx.ErrTxClosed), faultRecord},
		{"connection failure", pgErr("08006"), faultDB},
		{"serialization failure", pgErr("40001"), faultDB},
		{"deadlock", pgErr("40P01"), faultDB},
		{"disk full", pgErr("53100"), faultDB},
		{"statement timeout", pgErr("57014"), faultDB},
		{"admin shutdown", pgErr("57P01"), faultDB},
		{"lock timeout", pgErr("55P03"), faultDB},
		{"object in use (not 55P03)", pgErr("55006"), faultDB},
		{"internal error", pgErr("XX000"), faultDB},
		{"network error", errors.New("read tcp: connection reset by peer"), faultDB},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classifyOwn(c.err); got != c.want {
				t.Errorf("classifyOwn(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

// TestRefusedForGood: a dead letter Kafka will never take (too large, an
// ACL denial, invalid) stops the member; Kafka's passing state is retried.
func TestRefusedForGood(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("%w (uncompressed_bytes=205025)", kerr.MessageTooLarge), true},
		{kerr.TopicAuthorizationFailed, true},
		{kerr.RecordListTooLarge, true},
		{kerr.InvalidRecord, true},
		{kerr.PolicyViolation, true},
		{kerr.UnknownTopicOrPartition, false},
		{kerr.NotLeaderForPartition, false},
		{kerr.RequestTimedOut, false},
		{context.DeadlineExceeded, false},
		{errors.New("dial tcp: connection refused"), false},
	} {
		if got := refusedForGood(c.err); got != c.want {
			t.Errorf("refusedForGood(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestValidateID(t *testing.T) {
	for _, c := range []struct {
		id, want string
	}{
		{"0f8fad5b-d9cb-469f-a165-70867728950e", ""},
		{"ünïcode-ok", ""},
		{strings.Repeat("x", MaxIDBytes), ""},
		{"", "no id header"},
		{strings.Repeat("x", MaxIDBytes+1), "bytes"},
		{"a\x00b", "NUL"},
		{"a\xffb", "UTF-8"},
	} {
		err := validateID(c.id)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("validateID(%q) = %v, want %q", c.id[:min(len(c.id), 20)], err, c.want)
		}
	}
}

// TestClassifyHandler: a transient SQLSTATE the handler raised is the
// database's; Permanent and anything else are the record's.
func TestClassifyHandler(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want fault
	}{
		{"lock timeout", pgErr("55P03"), faultDB},
		{"statement timeout", pgErr("57014"), faultDB},
		{"deadlock", pgErr("40P01"), faultDB},
		{"serialization failure", pgErr("40001"), faultDB},
		{"too many connections", pgErr("53300"), faultDB},
		{"unique violation", pgErr("23505"), faultRecord},
		{"raise exception in a trigger", pgErr("P0001"), faultRecord},
		{"the handler's verdict", errors.New("unknown currency"), faultRecord},
		{"permanent wrapping a transient state", Permanent(pgErr("40001")), faultRecord},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classifyHandler(c.err); got != c.want {
				t.Errorf("classifyHandler(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}
