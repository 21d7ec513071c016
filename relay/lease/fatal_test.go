package lease

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestFatal: the lease session stops on what the connector stops on, a
// certificate a TLS handshake failed on included (an expired client
// certificate was retried for ever here: a standby only ever said it was
// unready), and on a missing lease table; a network error is retried.
func TestFatal(t *testing.T) {
	expired := &tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired}}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"expired certificate", fmt.Errorf("open the lease session: %w", expired), true},
		{"password", &pgconn.PgError{Code: "28P01"}, true},
		{"no lease table", &pgconn.PgError{Code: "42P01"}, true},
		{"connection refused", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"), false},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, false},
	} {
		if got := fatal(c.err); got != c.want {
			t.Errorf("%s: fatal = %v; want %v", c.name, got, c.want)
		}
	}
}
