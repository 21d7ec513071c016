package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/kafkaopt"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

const (
	securePGPassword    = "pg-Pa55-s3cret"
	secureKafkaUser     = "outbox"
	secureKafkaPassword = "kafka-Pa55-s3cret"
)

// TestSecureConnections runs the connector binary against a real Kafka
// broker's SASL_SSL listener (SCRAM) and a PostgreSQL cluster with ssl=on
// that demands a client certificate and a SCRAM password of the
// least-privilege role outbox_connector (one broker and one cluster for
// every case). With good settings events flow end to end and both of the
// connector's PostgreSQL connections use TLS with its certificate. Each bad
// setting ends the connector at start with exit code 1 and one line that
// names the variable to change; no password ever appears in its output.
func TestSecureConnections(t *testing.T) {
	pki := testenv.NewPKI(t, "outbox_connector")
	k := testenv.StartSecureKafka(t, pki, map[string]string{secureKafkaUser: secureKafkaPassword})
	pg := testenv.StartPostgres(t, testenv.PGOptions{
		Settings: map[string]string{
			"ssl":           "on",
			"ssl_cert_file": "'server.crt'",
			"ssl_key_file":  "'server.key'",
			"ssl_ca_file":   "'ca.crt'",
		},
		// outbox_connector only over TLS, with a certificate naming it and
		// its password; the superuser keeps trust for the test's setup.
		HBA: []string{
			"hostssl outbox outbox_connector 127.0.0.1/32 scram-sha-256 clientcert=verify-full",
			"hostssl replication outbox_connector 127.0.0.1/32 scram-sha-256 clientcert=verify-full",
			"host all outbox_connector 127.0.0.1/32 reject",
			"host replication outbox_connector 127.0.0.1/32 reject",
		},
		Files: map[string][]byte{
			"server.crt": pki.Read(t, pki.ServerCert),
			"server.key": pki.Read(t, pki.ServerKey),
			"ca.crt":     pki.Read(t, pki.CA),
		},
	})
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER ROLE outbox_connector PASSWORD '%s'", securePGPassword)); err != nil {
		t.Fatal(err)
	}
	passFile := filepath.Join(t.TempDir(), "kafka-password")
	if err := os.WriteFile(passFile, []byte(secureKafkaPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dsn := func(password, rootCert, cert, key string) string {
		q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {rootCert}}
		if cert != "" {
			q.Set("sslcert", cert)
			q.Set("sslkey", key)
		}
		u := url.URL{Scheme: "postgres", User: url.UserPassword("outbox_connector", password),
			Host: fmt.Sprintf("127.0.0.1:%d", pg.Port), Path: "/outbox", RawQuery: q.Encode()}
		return u.String()
	}
	good := map[string]string{
		"OUTBOX_PG_DSN":                   dsn(securePGPassword, pki.CA, pki.ClientCert, pki.ClientKey),
		"OUTBOX_KAFKA_TLS_CA_FILE":        pki.CA,
		"OUTBOX_KAFKA_SASL_MECHANISM":     "SCRAM-SHA-512",
		"OUTBOX_KAFKA_SASL_USERNAME":      secureKafkaUser,
		"OUTBOX_KAFKA_SASL_PASSWORD_FILE": passFile,
		"OUTBOX_TOPIC_PARTITIONS":         "1",
	}
	// env is the good settings with changes (name, value; an empty value
	// unsets).
	env := func(changes ...string) map[string]string {
		e := connectorEnv(pg, k.Addr)
		for name, v := range good {
			e[name] = v
		}
		for i := 0; i+1 < len(changes); i += 2 {
			if changes[i+1] == "" {
				delete(e, changes[i])
			} else {
				e[changes[i]] = changes[i+1]
			}
		}
		return e
	}
	bin := testenv.Binary(t, "connector")
	secrets := []string{securePGPassword, secureKafkaPassword}

	t.Run("streams over TLS with SCRAM", func(t *testing.T) {
		kc := kafkaopt.Config{Brokers: k.Addr, ClientID: "secure-test", TLSCAFile: pki.CA,
			SASLMechanism: "SCRAM-SHA-512", SASLUsername: secureKafkaUser, SASLPassword: secureKafkaPassword}
		c := testenv.StartConsumerWith(t, kc.Opts(nil), "outbox.event.secure")
		p := testenv.StartProc(t, bin, env())
		waitOutput(t, p, "msg=streaming", 60*time.Second)
		w := testenv.NewWriter()
		w.Write(t, ctx, admin, "secure", 50, 5, 10)
		c.WaitFor(t, w.Events, 60*time.Second)
		if dups := c.Verify(t, w.Events); dups != 0 {
			t.Errorf("%d duplicates", dups)
		}
		// Both PostgreSQL connections (the replication one streams, the
		// normal one holds the lease) are TLS with the client certificate.
		rows, err := admin.Query(ctx, `SELECT a.backend_type, s.ssl, coalesce(s.client_dn, '')
			FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
			WHERE a.usename = 'outbox_connector' ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]bool{}
		for rows.Next() {
			var kind, dn string
			var ssl bool
			if err := rows.Scan(&kind, &ssl, &dn); err != nil {
				t.Fatal(err)
			}
			t.Logf("connector backend %s: ssl=%v client_dn=%s", kind, ssl, dn)
			if !ssl || dn != "/CN=outbox_connector" {
				t.Errorf("%s connection: ssl=%v client_dn=%q; want TLS with /CN=outbox_connector", kind, ssl, dn)
			}
			kinds[kind] = true
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if !kinds["walsender"] || !kinds["client backend"] {
			t.Errorf("connector backends %v; want a walsender and a client backend", kinds)
		}
		p.Signal(syscall.SIGTERM)
		if code := p.Wait(t, 60*time.Second); code != 0 {
			t.Errorf("SIGTERM: exit code %d; output:\n%s", code, tail(p.Output()))
		}
		noSecrets(t, p.Output(), secrets)
		t.Logf("%d events over PostgreSQL TLS (verify-full, client certificate, SCRAM) and Kafka SASL_SSL (SCRAM-SHA-512)", len(w.Events))
	})

	bad := []struct {
		name string
		env  []string // changed variables, name then value
		want string   // the error line starts with "connector: " and this
	}{
		{"Kafka: unrelated CA", []string{"OUTBOX_KAFKA_TLS_CA_FILE", pki.OtherCA},
			"OUTBOX_KAFKA_TLS_CA_FILE: the broker's certificate is not signed by a CA in OUTBOX_KAFKA_TLS_CA_FILE (" + pki.OtherCA + ") (x509: certificate signed by unknown authority)"},
		{"Kafka: wrong SCRAM password", []string{"OUTBOX_KAFKA_SASL_PASSWORD_FILE", "", "OUTBOX_KAFKA_SASL_PASSWORD", "wrong-" + secureKafkaPassword},
			`OUTBOX_KAFKA_SASL_PASSWORD: the broker refused user "outbox" with SCRAM-SHA-512`},
		{"Kafka: PLAIN not enabled", []string{"OUTBOX_KAFKA_SASL_MECHANISM", "PLAIN"},
			"OUTBOX_KAFKA_SASL_MECHANISM: the broker does not enable PLAIN on this listener; it offers SCRAM-SHA-512, SCRAM-SHA-256"},
		{"PostgreSQL: unrelated CA", []string{"OUTBOX_PG_DSN", dsn(securePGPassword, pki.OtherCA, pki.ClientCert, pki.ClientKey)},
			"OUTBOX_PG_DSN: the server's certificate is not signed by a CA in sslrootcert (x509: certificate signed by unknown authority)"},
		{"PostgreSQL: wrong password", []string{"OUTBOX_PG_DSN", dsn("wrong-"+securePGPassword, pki.CA, pki.ClientCert, pki.ClientKey)},
			`OUTBOX_PG_DSN: PostgreSQL refused the password of user "outbox_connector"`},
		{"PostgreSQL: expired client certificate", []string{"OUTBOX_PG_DSN", dsn(securePGPassword, pki.CA, pki.ExpiredCert, pki.ExpiredKey)},
			"OUTBOX_PG_DSN: PostgreSQL refused the TLS handshake (remote error: tls: expired certificate)"},
		{"PostgreSQL: no client certificate", []string{"OUTBOX_PG_DSN", dsn(securePGPassword, pki.CA, "", "")},
			`OUTBOX_PG_DSN: PostgreSQL refused the connection as user "outbox_connector" (connection requires a valid client certificate, SQLSTATE 28000)`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			p := testenv.StartProc(t, bin, env(tc.env...))
			code := p.Wait(t, 30*time.Second)
			out := p.Output()
			var line string
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "connector: ") {
					line = l
				}
			}
			t.Logf("exit %d after %s: %s", code, time.Since(start).Round(time.Millisecond), line)
			if code != 1 {
				t.Errorf("exit code %d; want 1", code)
			}
			if !strings.HasPrefix(line, "connector: "+tc.want) {
				t.Errorf("error line %q; want it to start with %q; output:\n%s", line, "connector: "+tc.want, tail(out))
			}
			if strings.Contains(out, "msg=starting") {
				t.Errorf("the connector started before refusing the setting:\n%s", tail(out))
			}
			noSecrets(t, out, append(secrets, "wrong-"+securePGPassword, "wrong-"+secureKafkaPassword))
		})
	}
}

func noSecrets(t *testing.T, out string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("the output holds the secret %q:\n%s", s, tail(out))
		}
	}
}
