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
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/internal/webconfig/webconfigtest"
)

// TestNoSecretsInOutput runs the slotwatch binary with every kind of secret
// set: two servers in SLOTWATCH_PG_DSN_FILE (one with outbox_slotwatch's
// password, one with a wrong password that PostgreSQL refuses), a webhook
// URL with a user, a password and a token, and a web-config user. Alerts
// fire and are delivered; the database then stops (errors are logged,
// DatabaseUnreachable fires); -help is printed. No secret, nor the web
// password's bcrypt hash, appears in any line slotwatch wrote, in /metrics,
// /slots, / or /healthz, nor in the alerts it sent.
func TestNoSecretsInOutput(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{HBA: []string{"host all outbox_slotwatch 127.0.0.1/32 scram-sha-256"}})
	ctx := context.Background()
	swPW, wrongPW := "swpw-"+uuid.NewString(), "wrongpw-"+uuid.NewString()
	hookPW, hookToken := "hookpw-"+uuid.NewString(), "hooktoken-"+uuid.NewString()
	webPW, wrongWeb := "webpw-"+uuid.NewString(), "wrongweb-"+uuid.NewString()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER ROLE outbox_slotwatch PASSWORD '%s'", swPW)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('secret_test_slot', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, pg.DSNUser("outbox", "outbox_slotwatch")); err == nil {
		c.Close(ctx)
		t.Fatal("outbox_slotwatch connected without its password: pg_hba.conf does not ask for it")
	}
	dsn := func(pw string) string {
		return fmt.Sprintf("postgres://outbox_slotwatch:%s@127.0.0.1:%d/outbox?sslmode=disable", pw, pg.Port)
	}
	dir := t.TempDir()
	dsnFile := filepath.Join(dir, "dsn")
	if err := os.WriteFile(dsnFile, []byte("good="+dsn(swPW)+"\nbad="+dsn(wrongPW)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pki := testenv.NewPKI(t, "client")
	web := webconfigtest.Write(t, pki.ServerCert, pki.ServerKey, map[string]string{"prometheus": webPW})
	rawWeb, err := os.ReadFile(web)
	if err != nil {
		t.Fatal(err)
	}
	webHash := strings.TrimSpace(strings.SplitN(string(rawWeb), "prometheus: ", 2)[1])
	secrets := []string{swPW, wrongPW, hookPW, hookToken, webPW, wrongWeb, webHash}

	h := newHook(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	env := map[string]string{
		"SLOTWATCH_PG_DSN_FILE":       dsnFile,
		"SLOTWATCH_LISTEN":            addr,
		"SLOTWATCH_INTERVAL":          "200ms",
		"SLOTWATCH_TIMEOUT":           "2s",
		"SLOTWATCH_ALERT_FOR":         "0s",
		"SLOTWATCH_LAG_WARN_BYTES":    "1", // a slot that has any lag fires SlotLagHigh
		"SLOTWATCH_ALERT_WEBHOOK_URL": "http://hook:" + hookPW + "@" + strings.TrimPrefix(h.srv.URL, "http://") + "/alerts?token=" + hookToken,
		"SLOTWATCH_WEB_CONFIG":        web,
		"SLOTWATCH_LOG_LEVEL":         "debug",
	}
	bin := testenv.Binary(t, "slotwatch")
	p := testenv.StartProc(t, bin, env)
	cl := webconfigtest.Client(t, pki.CA)
	var seen strings.Builder
	scrape := func() {
		for _, path := range []string{"/metrics", "/slots", "/", "/healthz"} {
			for _, pw := range []string{webPW, wrongWeb} {
				code, body, err := webconfigtest.Get(cl, "https://"+addr+path, "prometheus", pw)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				if (pw == webPW) != (code == 200) {
					t.Errorf("GET %s: %d", path, code)
				}
				fmt.Fprintf(&seen, "%s %d\n%s\n", path, code, body)
			}
		}
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		_, body, err := webconfigtest.Get(cl, "https://"+addr+"/slots", "prometheus", webPW)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(body, "secret_test_slot") && strings.Contains(body, "password authentication failed"), "slot or refused server not in /slots yet"
	})
	h.waitFor(t, "DatabaseUnreachable", "", "firing", 30*time.Second)
	scrape()

	if err := pg.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		return h.count("DatabaseUnreachable", "", "firing") >= 2 || strings.Count(h.rawText(), "DatabaseUnreachable") >= 2, h.summary()
	})
	time.Sleep(time.Second) // a few failed collections' worth of log
	scrape()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("exit %d:\n%s", code, tailString(p.Output(), 3000))
	}
	seen.WriteString(p.Output())
	hp := testenv.StartProc(t, bin, env, "-help")
	hp.Wait(t, 20*time.Second)
	seen.WriteString(hp.Output())
	seen.WriteString(h.rawText())

	all := seen.String()
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			t.Errorf("secret %.12s… appears in the output, a page or an alert: …%s…", s, all[max(0, i-200):min(len(all), i+len(s)+50)])
		}
	}
	if !strings.Contains(all, "slotwatch_slot_lag_bytes") || !strings.Contains(all, "DatabaseUnreachable") || !strings.Contains(all, "level=WARN") && !strings.Contains(all, "level=ERROR") {
		t.Errorf("the run did not cover what it should (slot metrics, a DatabaseUnreachable alert, logged errors); %d bytes seen", len(all))
	}
	t.Logf("%d lines, pages and alerts checked for %d secrets", strings.Count(all, "\n"), len(secrets))
}
