package kafkaopt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// unsecuredJWT is a token Kafka's default OAUTHBEARER validator (the
// unsecured one, for development) accepts while exp is in the future: an
// unsigned JWS with the principal in sub.
func unsecuredJWT(t *testing.T, sub string, exp time.Time) string {
	t.Helper()
	claims, err := json.Marshal(map[string]any{"sub": sub, "iat": time.Now().Add(-time.Minute).Unix(), "exp": exp.Unix()})
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(claims) + "."
}

// TestOAuthBearerTokenFileRotation: against a real broker's OAUTHBEARER
// listener, one client whose token file holds an expired token is refused;
// once the file holds a fresh token, the same client authenticates on its
// next connection, without a restart: the file is read again when it
// changes.
func TestOAuthBearerTokenFileRotation(t *testing.T) {
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	testenv.StartKafka(t,
		"listeners=PLAINTEXT://127.0.0.1:@PORT@,CONTROLLER://127.0.0.1:@CONTROLLER_PORT@,SASL_PLAINTEXT://"+addr,
		"advertised.listeners=PLAINTEXT://127.0.0.1:@PORT@,SASL_PLAINTEXT://"+addr,
		"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
		"sasl.enabled.mechanisms=OAUTHBEARER",
		"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
	)
	tokenPath := filepath.Join(t.TempDir(), "token")
	expired := unsecuredJWT(t, "alice", time.Now().Add(-time.Hour))
	if err := os.WriteFile(tokenPath, []byte(expired+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Config{Brokers: addr, ClientID: "oauth-test", SASLMechanism: "OAUTHBEARER", SASLOAuthTokenFile: tokenPath}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(c.Opts(nil), kgo.RetryTimeout(2*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = adm.BrokerMetadata(ctx)
	cancel()
	if err == nil {
		t.Fatal("the broker accepted an expired token")
	}
	t.Logf("expired token: %v", err)
	if strings.Contains(err.Error(), expired) {
		t.Errorf("the error shows the token: %v", err)
	}

	// Rotate the token, as a sidecar would: write another file and rename
	// it over the old one (a new modification time).
	time.Sleep(10 * time.Millisecond)
	fresh := unsecuredJWT(t, "alice", time.Now().Add(time.Hour))
	tmp := tokenPath + ".new"
	if err := os.WriteFile(tmp, []byte(fresh+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, tokenPath); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = adm.BrokerMetadata(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the same client still fails 30 s after the token file got a fresh token: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// And it produces with it.
	topic := "oauth-rotation"
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, -1, nil, topic); err != nil {
		t.Fatalf("create topic over OAUTHBEARER: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce over OAUTHBEARER after the rotation: %v", err)
	}
}
