// Package fatal is the connector's error policy: which errors stop it (an
// Error, made where the cause is known and naming the operator's way out, or
// what only the deployment can fix: authentication, privilege, a missing
// database, a certificate that fails a TLS handshake) and which are
// retried with backoff (everything else). The run loop asks Is; the
// packages that find a cause make an Error.
package fatal

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
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
// privilege); a missing database (3D000) likewise; and so is a TLS
// handshake that failed on a certificate (see certificate), to PostgreSQL
// or to Kafka. They are so after start-up too, when the start-up checks
// passed: a client certificate that expires while the connector runs fails
// the next connection a session opens, and retried with backoff it failed
// every reconnect for ever, the leader holding its lease meanwhile; stopped,
// the process exits non-zero with the reason, a crash loop the platform
// shows, and its restart reads the certificate files again. Everything else
// from the network or a restarting server (class 08, 57P01..57P03, io
// errors) is transient and retried with backoff.
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
	return certificate(err)
}

// certificate reports a TLS handshake that failed on a certificate: this
// side's verification of the server's (expired, signed by an unknown
// authority, not naming the host), or the server's refusal of ours, which
// it says with a TLS alert (PostgreSQL's OpenSSL sends "certificate
// expired" for an expired client certificate, Kafka's JSSE "certificate
// unknown" or "bad certificate"). crypto/tls returns an alert from the
// peer as a *net.OpError with Op "remote error" and an unexported error
// type whose texts name the alert ("tls: expired certificate", "tls: bad
// certificate", "tls: unknown certificate authority", "tls: certificate
// required", "tls: access denied", ...): those that name a certificate, or
// deny access, are the deployment's. Other alerts (an internal error, a
// bad record MAC) and resets mid-handshake are not.
func certificate(err error) bool {
	var (
		verify    *tls.CertificateVerificationError
		invalid   x509.CertificateInvalidError
		unknownCA x509.UnknownAuthorityError
		badHost   x509.HostnameError
		opErr     *net.OpError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &invalid), errors.As(err, &unknownCA), errors.As(err, &badHost):
		return true
	case errors.As(err, &opErr) && opErr.Op == "remote error" && opErr.Err != nil:
		alert := opErr.Err.Error()
		return strings.HasPrefix(alert, "tls: ") && (strings.Contains(alert, "certificate") || strings.Contains(alert, "access denied"))
	}
	return false
}
