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
// data-dependent SQLSTATEs; COMMIT, which runs the handler's deferred work,
// also on class 42 (but an object or privilege missing) and when it answered
// ROLLBACK; everything else is the database's or the deployment's (the table
// missing is not a record's fault, and dead-lettering every record for it
// would be a skip).
func TestClassifyOwn(t *testing.T) {
	for _, c := range []struct {
		name           string
		err            error
		dedupe, commit fault
	}{
		{"NUL byte or bad UTF-8", pgErr("22021"), faultRecord, faultRecord},
		{"value too long", pgErr("22001"), faultRecord, faultRecord},
		{"deferred unique violation at commit", pgErr("23505"), faultRecord, faultRecord},
		{"index row too large", pgErr("54000"), faultRecord, faultRecord},
		{"undefined table", pgErr("42P01"), faultDeployment, faultDeployment},
		{"undefined column", pgErr("42703"), faultDeployment, faultDeployment},
		{"permission denied", pgErr("42501"), faultDeployment, faultDeployment},
		{"schema missing", pgErr("3F000"), faultDeployment, faultDeployment},
		{"syntax error", pgErr("42601"), faultDeployment, faultRecord},
		{"commit answered rollback", fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback), faultDB, faultRecord},
		{"handler closed the transaction", fmt.Errorf("commit: %w", pgx.ErrTxClosed), faultDB, faultRecord},
		{"connection failure", pgErr("08006"), faultDB, faultDB},
		{"serialization failure", pgErr("40001"), faultDB, faultDB},
		{"deadlock", pgErr("40P01"), faultDB, faultDB},
		{"disk full", pgErr("53100"), faultDB, faultDB},
		{"statement timeout", pgErr("57014"), faultDB, faultDB},
		{"admin shutdown", pgErr("57P01"), faultDB, faultDB},
		{"lock timeout", pgErr("55P03"), faultDB, faultDB},
		{"object in use (not 55P03)", pgErr("55006"), faultDB, faultDB},
		{"internal error", pgErr("XX000"), faultDB, faultDB},
		{"network error", errors.New("read tcp: connection reset by peer"), faultDB, faultDB},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classifyDedupe(c.err); got != c.dedupe {
				t.Errorf("classifyDedupe(%v) = %v, want %v", c.err, got, c.dedupe)
			}
			if got := classifyCommit(c.err); got != c.commit {
				t.Errorf("classifyCommit(%v) = %v, want %v", c.err, got, c.commit)
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
// database's, an object or privilege missing the deployment's, Transient the
// dependency's; Permanent and anything else are the record's.
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
		{"transient: a gateway's 503", Transient(errors.New("payment gateway: 503")), faultDependency},
		{"permanent wins over transient", Permanent(Transient(errors.New("503"))), faultRecord},
		{"undefined column: deployed before its migration", pgErr("42703"), faultDeployment},
		{"undefined table", pgErr("42P01"), faultDeployment},
		{"undefined function", pgErr("42883"), faultDeployment},
		{"undefined type", pgErr("42704"), faultDeployment},
		{"permission denied", pgErr("42501"), faultDeployment},
		{"syntax error stays the record's", pgErr("42601"), faultRecord},
		{"datatype mismatch stays the record's", pgErr("42804"), faultRecord},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classifyHandler(c.err); got != c.want {
				t.Errorf("classifyHandler(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}
