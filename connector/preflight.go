package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/kafkaopt"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/relay/config"
)

// preflightTimeout bounds each start-up check: a server that does not
// answer within it is left to the relay's retries.
const preflightTimeout = 10 * time.Second

// badSetting is a PostgreSQL connection setting that can never work as it
// is; its message names OUTBOX_PG_DSN and what to change, without the
// password.
type badSetting struct{ msg string }

func (e *badSetting) Error() string { return e.msg }

// preflight connects once to PostgreSQL (a normal and a replication
// connection) and to Kafka before the connector competes for the lease.
// A setting that can never work (a certificate that does not verify, a
// refused password, client certificate or SASL mechanism) ends the
// connector with a message naming it: the relay would otherwise retry it
// forever. A server that does not answer yet is only logged, so that the
// connector may start before its servers do.
func preflight(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	var pgErr, kafkaErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, preflightTimeout)
		defer cancel()
		pgErr = checkPostgres(cctx, cfg.PGDSN, cfg.Source != "poll")
	})
	wg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, preflightTimeout)
		defer cancel()
		kafkaErr = cfg.Kafka.Check(cctx)
	})
	wg.Wait()
	var bad *badSetting
	var badKafka *kafkaopt.ConfigError
	var fatal []error
	if errors.As(pgErr, &bad) {
		fatal = append(fatal, pgErr)
	} else if pgErr != nil && ctx.Err() == nil {
		log.Warn("PostgreSQL does not answer yet; starting anyway, the connector retries", "err", pgErr)
	}
	if errors.As(kafkaErr, &badKafka) {
		fatal = append(fatal, kafkaErr)
	} else if kafkaErr != nil && ctx.Err() == nil {
		log.Warn("Kafka does not answer yet; starting anyway, the connector retries", "err", kafkaErr)
	}
	return errors.Join(fatal...)
}

// checkPostgres opens and closes a normal and (when replication, not in
// poll mode, which needs none) a replication connection with dsn
// (pg_hba.conf may treat them differently). It returns a
// *badSetting when the server or the TLS handshake refused the settings,
// and otherwise the error met, redacted.
func checkPostgres(ctx context.Context, dsn string, replication bool) error {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return &badSetting{"OUTBOX_PG_DSN: malformed connection string: " + config.RedactError(err, dsn)}
	}
	kinds := []bool{false}
	if replication {
		kinds = append(kinds, true)
	}
	for _, replication := range kinds {
		c := cfg.Copy()
		what := "the connection"
		if replication {
			c.RuntimeParams["replication"] = "database"
			what = "the replication connection"
		}
		conn, err := connectPastResets(ctx, c)
		if err != nil {
			if msg := classifyPG(err, what, cfg.User); msg != "" {
				return &badSetting{"OUTBOX_PG_DSN: " + config.RedactError(errors.New(msg), dsn)}
			}
			return fmt.Errorf("open %s to PostgreSQL: %w", what, config.Redact(err, dsn))
		}
		_ = conn.Close(ctx)
	}
	return nil
}

// resetWindow is how long a connection reset by the server is tried again
// before it is taken for a server that does not answer yet.
const resetWindow = 3 * time.Second

// connectPastResets connects, trying again for up to resetWindow while the
// server resets the connection. A server that refuses the client
// certificate sends a TLS alert and closes; a client that writes its
// startup message after the close reads a reset instead of the alert (seen
// in about one start in three on a loaded machine), which alone would pass
// for a transient failure and let the connector retry a setting that can
// never work. A later attempt reads the alert.
func connectPastResets(ctx context.Context, cfg *pgconn.Config) (*pgconn.PgConn, error) {
	deadline := time.Now().Add(resetWindow)
	wait := retry.New(50*time.Millisecond, 500*time.Millisecond)
	for {
		conn, err := pgconn.ConnectConfig(ctx, cfg)
		if err == nil || !isReset(err) || time.Now().After(deadline) {
			return conn, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait.NextBackOff()):
		}
	}
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// classifyPG says what to change when err shows that the settings can
// never work, and returns "" for an error a retry may get past (the server
// is down or starting, too many connections). It is the one place that
// decides which PostgreSQL connection errors are the settings' fault.
func classifyPG(err error, what, user string) string {
	var (
		pgErr     *pgconn.PgError
		unknownCA x509.UnknownAuthorityError
		badHost   x509.HostnameError
		invalid   x509.CertificateInvalidError
		opErr     *net.OpError
	)
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "28P01":
		return fmt.Sprintf("PostgreSQL refused the password of user %q (%s, SQLSTATE 28P01); check the password (in OUTBOX_PG_DSN, PGPASSWORD or the passfile)",
			user, pgErr.Message)
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "28"):
		hint := "check the user, its client certificate (sslcert, sslkey) and the server's pg_hba.conf"
		if what == "the replication connection" {
			hint += ", which needs a line for the database \"replication\""
		}
		return fmt.Sprintf("PostgreSQL refused %s as user %q (%s, SQLSTATE %s); %s", what, user, pgErr.Message, pgErr.Code, hint)
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return fmt.Sprintf("PostgreSQL refused %s as user %q (%s, SQLSTATE 42501); grant the role REPLICATION (sql/005_roles.sql does for outbox_connector)", what, user, pgErr.Message)
	case errors.As(err, &pgErr) && pgErr.Code == "3D000":
		return fmt.Sprintf("%s (SQLSTATE 3D000); fix the database name", pgErr.Message)
	case errors.As(err, &unknownCA):
		return fmt.Sprintf("the server's certificate is not signed by a CA in sslrootcert (%v); set sslrootcert to the CA that signed the server's certificate", unknownCA)
	case errors.As(err, &badHost):
		return fmt.Sprintf("the server's certificate does not name the host connected to (%v); connect by a name it lists, or use sslmode=verify-ca", badHost)
	case errors.As(err, &invalid):
		return fmt.Sprintf("the server's certificate is not valid (%v); renew it (the server's ssl_cert_file)", invalid)
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		// A TLS alert from the server: OpenSSL refused the client
		// certificate (expired, revoked, or signed by a CA the server's
		// ssl_ca_file lacks).
		return fmt.Sprintf("PostgreSQL refused the TLS handshake (%v); check the client certificate (sslcert, sslkey): renew it, or use one signed by a CA in the server's ssl_ca_file", opErr)
	case strings.Contains(err.Error(), "server refused TLS connection"):
		return "PostgreSQL does not accept TLS (ssl = off) and sslmode requires it; enable ssl on the server or change sslmode"
	}
	return ""
}
