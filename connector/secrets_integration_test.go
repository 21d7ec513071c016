package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/internal/webconfig/webconfigtest"
)

// TestNoSecretsInOutput runs the connector end to end with every kind of
// secret set: the database password in OUTBOX_PG_DSN, the Kafka SASL/SCRAM
// password through OUTBOX_KAFKA_SASL_PASSWORD_FILE (kfake with SASL as the
// broker), and a web-config user whose password a scraper sends. It streams
// events, then the database stops (errors are logged) and comes back, then
// runs with a wrong SASL password and with a wrong database password, and
// -help is printed. No secret, nor the password's bcrypt hash, appears in
// any line the connector wrote (stdout and stderr) nor in any page it served.
func TestNoSecretsInOutput(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{HBA: passwordHBA})
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	dbPW := "dbpw-" + uuid.NewString()
	dsn := setPassword(t, pg, "outbox_connector", dbPW)
	saslPW, wrongSASL, wrongDB := "saslpw-"+uuid.NewString(), "wrongsasl-"+uuid.NewString(), "wrongdb-"+uuid.NewString()
	webPW, wrongWeb := "webpw-"+uuid.NewString(), "wrongweb-"+uuid.NewString()

	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "connector", saslPW))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	brokers := strings.Join(kf.ListenAddrs(), ",")
	dir := t.TempDir()
	secretFile := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pki := testenv.NewPKI(t, "client")
	web := webconfigtest.Write(t, pki.ServerCert, pki.ServerKey, map[string]string{"prometheus": webPW})
	rawWeb, err := os.ReadFile(web)
	if err != nil {
		t.Fatal(err)
	}
	webHash := strings.TrimSpace(strings.SplitN(string(rawWeb), "prometheus: ", 2)[1])
	secrets := []string{dbPW, saslPW, wrongSASL, wrongDB, webPW, wrongWeb, webHash}

	env := map[string]string{
		"OUTBOX_PG_DSN":                   dsn,
		"OUTBOX_KAFKA_BROKERS":            brokers,
		"OUTBOX_KAFKA_SASL_MECHANISM":     "SCRAM-SHA-256",
		"OUTBOX_KAFKA_SASL_USERNAME":      "connector",
		"OUTBOX_KAFKA_SASL_PASSWORD_FILE": secretFile("sasl", saslPW),
		"OUTBOX_HTTP_ADDR":                "127.0.0.1:0",
		"OUTBOX_HTTP_WEB_CONFIG":          web,
		"OUTBOX_STATUS_INTERVAL":          "200ms",
		"OUTBOX_LEASE_TTL":                "2s",
		"OUTBOX_TOPIC_PARTITIONS":         "1",
		"OUTBOX_LOG_LEVEL":                "debug", // the most the connector ever says
	}
	var seen strings.Builder // every line written and every page served
	p := testenv.StartProc(t, bin, env)
	addr := httpAddr(t, p)
	waitOutput(t, p, "msg=streaming", 60*time.Second)
	cl := webconfigtest.Client(t, pki.CA)
	scrape := func() {
		for _, path := range []string{"/metrics", "/healthz", "/readyz", "/leader"} {
			for _, pw := range []string{webPW, wrongWeb} {
				code, body, err := webconfigtest.Get(cl, "https://"+addr+path, "prometheus", pw)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				if pw == wrongWeb && code != 401 {
					t.Errorf("GET %s with a wrong password: %d", path, code)
				}
				fmt.Fprintf(&seen, "%s %d\n%s\n", path, code, body)
			}
		}
	}

	// Events flow through SASL/SCRAM.
	conn := pg.Conn(t, "outbox")
	aggType := "sec" + fmt.Sprint(time.Now().UnixNano()%1e9)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 20, 2, 5)
	consumeSASL(t, brokers, "connector", saslPW, "outbox.event."+aggType, len(w.Events))
	scrape()

	// The database goes away: the connector logs what fails, and recovers.
	before := strings.Count(p.Output(), "\n")
	if err := pg.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(p.Output()[len(lineAt(p.Output(), before)):], "level=WARN") && !strings.Contains(p.Output()[len(lineAt(p.Output(), before)):], "level=ERROR") {
		if time.Now().After(deadline) {
			t.Fatalf("nothing logged while the database is down:\n%s", tail(p.Output()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // a few retries' worth of errors
	scrape()
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	for strings.Count(p.Output(), "msg=streaming") < 2 {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("did not stream again after the database came back (exited=%v):\n%s", p.Exited(), tail(p.Output()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	scrape()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Errorf("exit %d", code)
	}
	seen.WriteString(p.Output())

	// Wrong credentials: what the connector says about a refusal must not
	// show what it sent either.
	for _, bad := range []map[string]string{
		{"OUTBOX_KAFKA_SASL_PASSWORD_FILE": secretFile("wrong-sasl", wrongSASL)},
		{"OUTBOX_PG_DSN": strings.Replace(dsn, dbPW, wrongDB, 1)},
	} {
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for k, v := range bad {
			e[k] = v
		}
		bp := testenv.StartProc(t, bin, e)
		// Until the refusal is reported (logged, or the exit line), then a
		// few retries more.
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && !bp.Exited(); time.Sleep(100 * time.Millisecond) {
			if o := bp.Output(); strings.Contains(o, "password authentication failed") || strings.Contains(o, "connection initialization failed") {
				time.Sleep(time.Second)
				break
			}
		}
		bp.Signal(syscall.SIGTERM)
		bp.Wait(t, 60*time.Second)
		if o := bp.Output(); !strings.Contains(o, "password authentication failed") && !strings.Contains(o, "connection initialization failed") {
			t.Errorf("with %v the connector reported no failure:\n%s", keys(bad), tail(bp.Output()))
		}
		seen.WriteString(bp.Output())
	}
	hp := testenv.StartProc(t, bin, env, "-help")
	hp.Wait(t, 20*time.Second)
	seen.WriteString(hp.Output())

	all := seen.String()
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			t.Errorf("secret %.12s… appears in the output or a page: …%s…", s, all[max(0, i-200):min(len(all), i+len(s)+50)])
		}
	}
	if !strings.Contains(all, "outbox_connector_leader") || !strings.Contains(all, "password authentication failed") {
		t.Errorf("the run did not cover what it should (metrics page, a refused database password); %d bytes seen", len(all))
	}
	t.Logf("%d lines and pages checked for %d secrets", strings.Count(all, "\n"), len(secrets))
}

// lineAt is the prefix of s made of its first n lines.
func lineAt(s string, n int) string {
	i := 0
	for ; n > 0; n-- {
		j := strings.IndexByte(s[i:], '\n')
		if j < 0 {
			return s
		}
		i += j + 1
	}
	return s[:i]
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// consumeSASL reads n committed records of topic as user.
func consumeSASL(t testing.TB, brokers, user, password, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...),
		kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha256Mechanism()),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := 0
	for got < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records of %s through SASL", got, n, topic)
		}
		got += fs.NumRecords()
	}
}
