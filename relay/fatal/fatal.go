// Package fatal is the connector's error policy: which errors stop it (an
// Error, made where the cause is known and naming the operator's way out, or
// what only the deployment can fix: authentication, privilege, a missing
// database) and which are retried with backoff (everything else). The run
// loop asks Is; the packages that find a cause make an Error.
package fatal

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Error is an error the connector must not retry: it names the cause
// and the operator's way out, and the process exits non-zero.
type Error struct {
	Msg string
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an Error.
func Errorf(format string, args ...any) error {
	return &Error{Msg: fmt.Sprintf(format, args...)}
}

// Is reports whether err must stop the connector rather than be retried.
// Authentication and authorization failures are the deployment's fault:
// retrying only fills logs (SQLSTATE class 28, and 42501 insufficient
// privilege); a missing database (3D000) likewise. Everything else from the
// network or a restarting server (class 08, 57P01..57P03, io errors) is
// transient and retried with backoff.
func Is(err error) bool {
	var fe *Error
	if errors.As(err, &fe) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "28"), pgErr.Code == "42501", pgErr.Code == "3D000":
			return true
		}
	}
	return false
}
