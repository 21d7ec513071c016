package inbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"
)

// fault says whose fault a failed attempt is; it is the one place that
// decides between "retry without limit" and "count an attempt, then
// dead-letter" (the rule: an error that belongs to one record and will not
// pass on retry makes that record a dead letter, never a loop; an innocent
// record is never dead-lettered for the database's state).
type fault int

const (
	// faultDB: the database, or the way to it, failed; the record is
	// innocent. Retried with backoff without limit, never dead-lettered.
	faultDB fault = iota + 1
	// faultRecord: the error belongs to this record (its data, or what the
	// handler does with it) and the same attempt fails the same way again.
	// It counts as an attempt; after MaxAttempts the record is a dead letter.
	faultRecord
	// faultDeployment: the database lacks what the code expects (a table,
	// column, function or privilege: the handler deployed before its
	// migration or grant, the inbox's own table missing). Every record fails
	// alike until an operator acts, then passes: retried like faultDB, but
	// logged at error level, since it does not pass with time alone.
	faultDeployment
	// faultDependency: the handler said the failure passes (Transient): a
	// service it calls. Retried like faultDB.
	faultDependency
)

func (f fault) String() string {
	switch f {
	case faultDB:
		return "database"
	case faultRecord:
		return "record"
	case faultDeployment:
		return "deployment"
	case faultDependency:
		return "dependency"
	}
	return "unknown"
}

// sqlState returns the SQLSTATE of the PostgreSQL error in err's chain, or
// "" when there is none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// recordState reports whether a SQLSTATE is about the statement and its
// data, so that the same statement with the same record fails again:
//
//	22 data exception: a NUL byte or invalid UTF-8 in text (22021), a value
//	   out of range, invalid input syntax
//	23 integrity constraint violation, including a deferrable constraint
//	   checked at COMMIT (23505)
//	42 syntax error or access rule violation
//	54 program limit exceeded: an index row too large (54000), too many
//	   columns or arguments
func recordState(code string) bool {
	switch code[:min(2, len(code))] {
	case "22", "23", "42", "54":
		return true
	}
	return false
}

// deploymentState reports whether a SQLSTATE says that the database lacks an
// object or a privilege the statement names: undefined table (42P01), column
// (42703), function (42883) or other object such as a type or a role
// (42704), a missing schema (3F000), insufficient privilege (42501). These
// are the signature of a handler deployed before its migration or grant, or
// of a grant revoked: every record fails alike, and all pass once the
// migration runs, with no change to the code or the records. Dead-lettering
// them would skip every event of the deployment window, against "never skip
// a real event", so they are retried aloud, although the issue placed class
// 42 with the record. The rest of class 42 stays the record's: a syntax error
// (42601), a type mismatch (42804), an ambiguous name (42702) need the
// statement to change, which no migration does, and a statement built from
// the payload makes them the record's own; after the fix they are redriven.
// A handler that builds identifiers from the payload (so that an undefined
// column is the record's) wraps the error with Permanent.
func deploymentState(code string) bool {
	switch code {
	case "42P01", "42703", "42883", "42704", "42501", "3F000":
		return true
	}
	return false
}

// transientState reports whether a SQLSTATE is about the database's state,
// which passes with time:
//
//	08 connection exception
//	40 transaction rollback: serialization failure (40001), deadlock (40P01)
//	53 insufficient resources: disk full, out of memory, too many connections
//	57 operator intervention: statement timeout or cancel (57014), shutdown
//	58 system error: an I/O error of the server
//	55P03 lock not available: lock_timeout, NOWAIT
func transientState(code string) bool {
	if code == "55P03" {
		return true
	}
	switch code[:min(2, len(code))] {
	case "08", "40", "53", "57", "58":
		return true
	}
	return false
}

// classifyCommit classifies an error of COMMIT, which runs the handler's
// deferred work (deferred constraints and triggers): record-class SQLSTATEs
// are the record's, as they would be from the handler. So is a COMMIT that
// answered ROLLBACK (a statement of the handler failed and the handler
// returned nil anyway, which it will do again) and a transaction the handler
// closed itself; a deploymentState is the deployment's. Everything else (a transient SQLSTATE, a connection broken
// during COMMIT, whose outcome the next attempt finds in the table, a class
// this cannot place) is the database's.
func classifyCommit(err error) fault {
	switch {
	case errors.Is(err, pgx.ErrTxCommitRollback), errors.Is(err, pgx.ErrTxClosed):
		return faultRecord
	}
	code := sqlState(err)
	switch {
	case deploymentState(code):
		return faultDeployment // a deferred trigger meeting a table not yet migrated
	case code != "" && recordState(code):
		return faultRecord
	}
	return faultDB
}

// classifyDedupe classifies an error of the inbox's own statements on its
// table (the dedupe INSERT, the read of a taken id, a redrive's UPDATE, the
// dead-letter mark). Their text is fixed and only the record's values vary,
// so only the data-dependent classes are the record's: 22 (the id or a
// value the column refuses), 23, 54 (an index row too large). Class 42 (and
// 3F000) here is the deployment's (the table missing, a privilege revoked, a
// schema from an older version): every record would fail alike, so it is
// retried aloud instead of dead-lettering the whole topic. Everything else
// the database says is the database's.
func classifyDedupe(err error) fault {
	code := sqlState(err)
	switch {
	case deploymentState(code), strings.HasPrefix(code, "42"):
		return faultDeployment
	case code != "" && recordState(code):
		return faultRecord
	}
	return faultDB
}

// classifyHandler classifies an error the handler returned. A transient
// SQLSTATE is the database's even though the handler raised it: a lock or
// statement timeout, a deadlock or a serialization failure says nothing about
// the record, and dead-lettering it would mark a real event done after one
// contention episode. So is an error that pgconn says never reached the
// server. An error wrapped with Transient is the dependency's (the handler
// has decided), a deploymentState the deployment's. An error wrapped with
// Permanent is the record's whatever it wraps (the handler has decided); so
// is anything else, the handler's own verdict on the record included: an
// error the inbox cannot place would, retried without limit, wedge the
// partition.
func classifyHandler(err error) fault {
	if errors.Is(err, ErrPermanent) {
		return faultRecord
	}
	if errors.Is(err, ErrTransient) {
		return faultDependency
	}
	code := sqlState(err)
	switch {
	case code != "" && transientState(code):
		return faultDB
	case deploymentState(code):
		return faultDeployment
	case pgconn.SafeToRetry(err):
		return faultDB
	}
	return faultRecord
}

// refusedForGood reports whether a produce error will not pass on retry:
// the record is larger than the client or the topic takes
// (MESSAGE_TOO_LARGE, which franz-go also returns before sending when the
// record exceeds ProducerBatchMaxBytes), or Kafka refused it with an error
// it does not call retriable (an ACL denial, RECORD_LIST_TOO_LARGE,
// INVALID_RECORD, POLICY_VIOLATION). Anything else (a timeout, a broker
// away, a topic being created) is Kafka's state and passes.
func refusedForGood(err error) bool {
	if errors.Is(err, kerr.MessageTooLarge) {
		return true
	}
	var ke *kerr.Error
	return errors.As(err, &ke) && !ke.Retriable
}

// topicMissing reports whether a produce error says that the topic does not
// exist (after franz-go's own UnknownTopicRetries): retriable for franz-go,
// but with auto-creation off it does not pass until someone creates it.
func topicMissing(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID)
}

// MaxIDBytes is the longest id header the inbox accepts. A longer one is
// dead-lettered at once: PostgreSQL's btree refuses an index entry over about
// 2.7 kB (54000), and an id that long is not an event id.
const MaxIDBytes = 1024

// validateID returns why id cannot be deduplicated, or nil. PostgreSQL text
// cannot hold a NUL byte and refuses invalid UTF-8 (22021) in a UTF-8
// database; checking first gives the dead letter a clear reason and never
// sends the database a statement that fails for the record. The reasons do
// not quote the id: it is in the record's id header, and may be long.
func validateID(id string) error {
	switch {
	case id == "":
		return errors.New("record has no id header: it cannot be deduplicated")
	case len(id) > MaxIDBytes:
		return fmt.Errorf("id header is %d bytes, more than the %d bytes the inbox keeps: it cannot be deduplicated", len(id), MaxIDBytes)
	case strings.IndexByte(id, 0) >= 0:
		return errors.New("id header contains a NUL byte, which PostgreSQL text cannot hold: it cannot be deduplicated")
	case !utf8.ValidString(id):
		return errors.New("id header is not valid UTF-8: it cannot be deduplicated")
	}
	return nil
}
