package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// SecureKafka is a dedicated broker with a SASL_SSL listener as well as its
// PLAINTEXT one (which the test uses for setup and the broker for itself).
type SecureKafka struct {
	*Kafka
	// Addr is the SASL_SSL listener, host:port, with a certificate signed
	// by the PKI's CA and SCRAM-SHA-512 and SCRAM-SHA-256 enabled (and
	// nothing else: PLAIN is refused there).
	Addr string
}

// StartSecureKafka starts a dedicated broker whose SASL_SSL listener
// presents pki's server certificate, and gives each of users (name ->
// password) SCRAM-SHA-512 and SCRAM-SHA-256 credentials. The key store and
// trust store are PEM files, which Kafka reads directly (no keytool).
func StartSecureKafka(t testing.TB, pki *PKI, users map[string]string) *SecureKafka {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	jaas := "org.apache.kafka.common.security.scram.ScramLoginModule required;"
	k := StartKafka(t,
		"listeners=PLAINTEXT://127.0.0.1:@PORT@,CONTROLLER://127.0.0.1:@CONTROLLER_PORT@,SASL_SSL://"+addr,
		"advertised.listeners=PLAINTEXT://127.0.0.1:@PORT@,SASL_SSL://"+addr,
		"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
		"sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256",
		"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="+jaas,
		"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config="+jaas,
		"ssl.keystore.type=PEM",
		"ssl.keystore.location="+pki.ServerPEM,
		"ssl.truststore.type=PEM",
		"ssl.truststore.location="+pki.CA,
	)
	if err := addSCRAMUsers(context.Background(), k.Brokers, users); err != nil {
		Unavailable(t, "create SCRAM users on the broker at %s: %v", k.Brokers, err)
	}
	t.Logf("SASL_SSL listener on %s (SCRAM-SHA-512, SCRAM-SHA-256)", addr)
	return &SecureKafka{Kafka: k, Addr: addr}
}

// addSCRAMUsers upserts the users' credentials through the PLAINTEXT
// listener and waits until the broker describes them: credentials reach the
// broker through the metadata log, a moment after the controller accepted
// them.
func addSCRAMUsers(ctx context.Context, brokers string, users map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var names []string
	for name := range users {
		names = append(names, name)
	}
	// One request per mechanism: a request may name a user only once.
	for _, m := range []kadm.ScramMechanism{kadm.ScramSha512, kadm.ScramSha256} {
		var upsert []kadm.UpsertSCRAM
		for name, pass := range users {
			upsert = append(upsert, kadm.UpsertSCRAM{User: name, Mechanism: m, Iterations: 4096, Password: pass})
		}
		res, err := adm.AlterUserSCRAMs(ctx, nil, upsert)
		if err == nil {
			err = res.Error()
		}
		if err != nil {
			return fmt.Errorf("alter %s credentials: %w", m, err)
		}
	}
	for {
		described, err := adm.DescribeUserSCRAMs(ctx, names...)
		if err == nil && described.Error() == nil && len(described) == len(names) {
			ready := true
			for _, d := range described {
				ready = ready && len(d.CredInfos) == 2
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the broker does not describe the SCRAM users yet: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
