package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// passwordHBA makes PostgreSQL ask the roles sql/005_roles.sql creates for
// their password (SCRAM) on TCP, replication connections included; every
// other role keeps the test clusters' trust.
var passwordHBA = []string{
	"host all outbox_connector 127.0.0.1/32 scram-sha-256",
	"host replication outbox_connector 127.0.0.1/32 scram-sha-256",
	"host all outbox_slotwatch 127.0.0.1/32 scram-sha-256",
}

// setPassword gives role a password and returns the role's DSN with it; it
// also checks that the cluster refuses the role without it, so that what
// follows really runs as that role, authenticated.
func setPassword(t testing.TB, pg *testenv.Postgres, role, password string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := pg.Conn(t, "outbox").Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, password)); err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, pg.DSNUser("outbox", role)); err == nil {
		c.Close(ctx)
		t.Fatalf("%s connected without its password: pg_hba.conf does not ask for it", role)
	}
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/outbox?sslmode=disable", role, password, pg.Port)
}

// TestLeastPrivilege runs the connector binary end to end as outbox_connector
// (sql/005_roles.sql: LOGIN REPLICATION, no superuser), authenticated with a
// password: it creates its slot, publishes the rows already in the outbox
// (initial snapshot), streams new ones, dead-letters an unroutable event to
// the DLQ topic and an oversized one to outbox_dead_letter, and writes its
// state and lease rows; the role owns nothing but outbox_connector_state and
// outbox_lease. Then slotwatch runs as outbox_slotwatch (pg_monitor only) and
// reports the slot's lag.
func TestLeastPrivilege(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{HBA: passwordHBA})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")

	var super, repl bool
	if err := conn.QueryRow(ctx, "SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = 'outbox_connector'").Scan(&super, &repl); err != nil {
		t.Fatal(err)
	}
	if super || !repl {
		t.Fatalf("outbox_connector: superuser %v, replication %v; want false, true", super, repl)
	}
	owned := func() []string {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
			WHERE r.rolname = 'outbox_connector' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	want := []string{"outbox_backfill", "outbox_connector_state", "outbox_lease"}
	if got := owned(); !slices.Equal(got, want) {
		t.Fatalf("outbox_connector owns %v; want only %v", got, want)
	}
	dsn := setPassword(t, pg, "outbox_connector", "conn-pw-"+uuid.NewString())

	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "lp"+suffix, "lpdlq"+suffix
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	dc := testenv.StartConsumer(t, brokers, dlq)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 30, 3, 5) // before the slot exists: the initial snapshot's
	env := connectorEnv(pg, brokers, "OUTBOX_PG_DSN", dsn, "OUTBOX_DLQ_TOPIC", dlq)
	p := testenv.StartProc(t, bin, env)
	waitOutput(t, p, "msg=streaming", 60*time.Second)
	w.Write(t, ctx, conn, aggType, 30, 3, 5) // streamed
	badID, bigID := uuid.NewString(), uuid.NewString()
	big := `{"pad": "` + strings.Repeat("z", 1200000) + `"}`
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
		($1, $2, 'a1', 'Bad', '{"bad": true}'), ($3, $4, 'a2', 'Big', $5)`, badID, "bad type!"+suffix, bigID, aggType, big); err != nil {
		t.Fatal(err)
	}
	w.Write(t, ctx, conn, aggType, 10, 3, 5)
	c.WaitFor(t, w.Events, time.Minute)
	dc.WaitFor(t, []testenv.Event{{ID: badID}}, time.Minute)
	var class string
	if err := conn.QueryRow(ctx, "SELECT error_class FROM outbox_dead_letter WHERE id = $1", bigID).Scan(&class); err != nil || class != "record-too-large" {
		t.Errorf("the oversized event in outbox_dead_letter: class %q, %v; want record-too-large", class, err)
	}

	// The state and the lease are written, by outbox_connector.
	var snapshotDone bool
	var confirmed string
	if err := conn.QueryRow(ctx, "SELECT snapshot_done, confirmed_lsn::text FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&snapshotDone, &confirmed); err != nil || !snapshotDone || confirmed == "0/0" {
		t.Errorf("outbox_connector_state: snapshot_done %v, confirmed %s, %v; want true and a position", snapshotDone, confirmed, err)
	}
	var token int64
	if err := conn.QueryRow(ctx, "SELECT token FROM outbox_lease WHERE slot_name = 'outbox_slot' AND holder_pid IS NOT NULL").Scan(&token); err != nil || token < 1 {
		t.Errorf("outbox_lease: token %d, %v; want a held lease", token, err)
	}
	var users []string
	rows, err := conn.Query(ctx, "SELECT DISTINCT usename::text FROM pg_stat_activity WHERE application_name <> '' AND usename IS NOT NULL AND pid <> pg_backend_pid() AND backend_type IN ('client backend', 'walsender')")
	if err != nil {
		t.Fatal(err)
	}
	if users, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(users, []string{"outbox_connector"}) {
		t.Errorf("the connector's sessions run as %v; want only outbox_connector", users)
	}
	if got := owned(); !slices.Equal(got, want) {
		t.Errorf("after the run outbox_connector owns %v; want only %v", got, want)
	}

	// slotwatch as outbox_slotwatch sees the slot.
	swDSN := setPassword(t, pg, "outbox_slotwatch", "sw-pw-"+uuid.NewString())
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	sw := testenv.StartProc(t, testenv.Binary(t, "slotwatch"), map[string]string{
		"SLOTWATCH_PG_DSN": swDSN, "SLOTWATCH_LISTEN": fmt.Sprintf("127.0.0.1:%d", port), "SLOTWATCH_INTERVAL": "200ms",
	})
	lagRE := regexp.MustCompile(`(?m)^slotwatch_slot_lag_bytes\{[^}]*slot="outbox_slot"[^}]*\} \d`)
	deadline := time.Now().Add(30 * time.Second)
	var body string
	for {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port)); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
		if lagRE.MatchString(body) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !lagRE.MatchString(body) {
		t.Errorf("slotwatch as outbox_slotwatch reports no lag for outbox_slot; log:\n%s\nmetrics:\n%s", tail(sw.Output()), grepLines(body, "slotwatch_"))
	}
	if m := regexp.MustCompile(`(?m)^slotwatch_up\{[^}]*\} (\d)`).FindStringSubmatch(body); m == nil || m[1] != "1" {
		t.Errorf("slotwatch_up = %v; want 1", m)
	}
	if strings.Contains(sw.Output(), "permission denied") || strings.Contains(sw.Output(), "level=ERROR") {
		t.Errorf("slotwatch as outbox_slotwatch logged errors:\n%s", tail(sw.Output()))
	}

	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("connector exit %d:\n%s", code, tail(p.Output()))
	}
	if strings.Contains(p.Output(), "permission denied") {
		t.Errorf("the connector hit a missing grant:\n%s", tail(p.Output()))
	}
	if dups := c.Verify(t, w.Events); dups != 0 {
		t.Logf("%d duplicates", dups)
	}
}

// grepLines keeps the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
