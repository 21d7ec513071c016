package main

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/slotwatch/web"
	"github.com/pgoutbox/pgoutbox/slotwatch/web/webtest"
)

// writeWAL writes n MiB of WAL, one committed logical message per MiB (a
// commit moves pg_current_wal_lsn, which lag is measured from).
func writeWAL(t testing.TB, pg *testenv.Postgres, n int) {
	t.Helper()
	c := pg.Conn(t, "outbox")
	for i := 0; i < n; i++ {
		if _, err := c.Exec(context.Background(), "SELECT pg_logical_emit_message(true, 'slotwatch-test', repeat('x', 1048576))"); err != nil {
			t.Fatal(err)
		}
	}
}

// Acceptance: a slot made to lag by writing WAL has slotwatch_slot_lag_bytes
// equal to the database's pg_wal_lsn_diff within one interval's WAL; the lag
// alert fires once past the threshold and resolves after the slot catches
// up, both delivered to a webhook in Alertmanager's format.
func TestLagBytesAndLagAlert(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	execAll(t, pg, "outbox", "SELECT pg_create_logical_replication_slot('lagging', 'pgoutput')")
	h := newHook(t)
	const interval = 200 * time.Millisecond
	sw := startSlotwatch(t, map[string]string{
		"SLOTWATCH_PG_DSN":            pg.DSN("outbox"),
		"SLOTWATCH_INTERVAL":          interval.String(),
		"SLOTWATCH_RATE_WINDOW":       "2s",
		"SLOTWATCH_LAG_WARN_BYTES":    "8388608", // 8 MiB
		"SLOTWATCH_LAG_CRIT_BYTES":    "1073741824",
		"SLOTWATCH_ALERT_FOR":         "600ms",
		"SLOTWATCH_ALERT_WEBHOOK_URL": h.srv.URL + "/hook",
	})
	slot := map[string]string{"slot": "lagging", "database": "outbox", "plugin": "pgoutput", "slot_type": "logical"}
	eventually(t, 5*time.Second, func() (bool, string) {
		_, ok := sw.metric(t, "slotwatch_slot_lag_bytes", slot)
		return ok, "slot not exported yet"
	})

	writeWAL(t, pg, 12)
	c := pg.Conn(t, "outbox")
	dbLag := func() float64 {
		var d float64
		if err := c.QueryRow(context.Background(),
			"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) FROM pg_replication_slots WHERE slot_name = 'lagging'").Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Let slotwatch collect after the writes, then compare with the database.
	eventually(t, 5*time.Second, func() (bool, string) {
		v, _ := sw.metric(t, "slotwatch_slot_lag_bytes", slot)
		return v >= 12<<20, "lag below what was written"
	})
	time.Sleep(2 * interval)
	before := dbLag()
	fams := sw.scrape(t)
	after := dbLag()
	got, _ := value(fams, "slotwatch_slot_lag_bytes", slot)
	rate, _ := value(fams, "slotwatch_wal_bytes_per_second", nil)
	// One interval's WAL: what the server writes in one interval at the
	// measured rate (near zero once the writes stopped), and at least a page
	// of background records (running-xacts, checkpoints).
	tol := math.Max(rate*interval.Seconds(), 8192)
	if got < before-tol || got > after+tol {
		t.Fatalf("slotwatch_slot_lag_bytes = %.0f, database says %.0f..%.0f (tolerance %.0f)", got, before, after, tol)
	}
	t.Logf("lag: slotwatch %.0f bytes, pg_wal_lsn_diff %.0f..%.0f", got, before, after)
	if ret, ok := value(fams, "slotwatch_slot_retained_wal_bytes", slot); !ok || ret < got {
		t.Errorf("retained WAL %.0f (present %v), want at least the lag %.0f", ret, ok, got)
	}
	if s, ok := value(fams, "slotwatch_slot_lag_seconds", slot); !ok || s <= 0 {
		t.Errorf("slotwatch_slot_lag_seconds = %v (present %v), want > 0", s, ok)
	}

	fired := h.waitFor(t, "SlotLagHigh", "lagging", "firing", 10*time.Second)
	checkWebhookFormat(t, fired, "warning")
	if l := fired.Alerts[0].Labels; l["slot"] != "lagging" || l["database"] != "outbox" {
		t.Errorf("labels %v", l)
	}
	// The shipped default for max_slot_wal_keep_size is -1.
	risky := h.waitFor(t, "RiskyConfiguration", "", "firing", 5*time.Second)
	checkWebhookFormat(t, risky, "warning")

	// The status page shows the slot.
	code, page := sw.get(t, "/")
	if code != 200 {
		t.Fatalf("status page: %d", code)
	}
	parsed, err := webtest.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatalf("status page does not parse: %v\n%s", err, page)
	}
	if r, ok := parsed.Rows["lagging"]; !ok || r.Level != "warn" || r.SparkPoints < 2 || !strings.Contains(r.Cells["Alerts"], "SlotLagHigh") {
		t.Errorf("status row for lagging: %+v", r)
	}

	// Catch up: the alert resolves.
	execAll(t, pg, "outbox", "SELECT pg_replication_slot_advance('lagging', pg_current_wal_lsn())")
	resolved := h.waitFor(t, "SlotLagHigh", "lagging", "resolved", 10*time.Second)
	checkWebhookFormat(t, resolved, "warning")
	if resolved.Alerts[0].Fingerprint != fired.Alerts[0].Fingerprint {
		t.Errorf("resolved fingerprint %s, fired %s", resolved.Alerts[0].Fingerprint, fired.Alerts[0].Fingerprint)
	}
	time.Sleep(5 * interval)
	if n := h.count("SlotLagHigh", "lagging", "firing"); n != 1 {
		t.Errorf("SlotLagHigh fired %d times, want once", n)
	}
	if n := h.count("SlotLagHigh", "lagging", "resolved"); n != 1 {
		t.Errorf("SlotLagHigh resolved %d times, want once", n)
	}
	if n := h.count("SlotLagCritical", "", "firing"); n != 0 {
		t.Errorf("SlotLagCritical fired below its threshold")
	}
	if v, _ := sw.metric(t, "slotwatch_slot_lag_bytes", slot); v > 64<<10 {
		t.Errorf("lag after catching up = %.0f", v)
	}
}

// Acceptance: with a small max_slot_wal_keep_size, a slot is driven to
// unreserved and then lost; the critical alerts fire in that order, each
// naming the slot, and the time to invalidation falls toward zero first.
func TestUnreservedThenLost(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true, Settings: map[string]string{
		"max_slot_wal_keep_size": "'32MB'",
		"min_wal_size":           "'32MB'",
		// Keep WAL-driven and timed checkpoints out of the way: the test
		// decides when WAL is removed.
		"max_wal_size":       "'1GB'",
		"checkpoint_timeout": "'1h'",
	}})
	execAll(t, pg, "outbox", "SELECT pg_create_logical_replication_slot('doomed', 'pgoutput')")
	h := newHook(t)
	sw := startSlotwatch(t, map[string]string{
		"SLOTWATCH_PG_DSN":            pg.DSN("outbox"),
		"SLOTWATCH_INTERVAL":          "200ms",
		"SLOTWATCH_RATE_WINDOW":       "1s",
		"SLOTWATCH_ALERT_FOR":         "0s",
		"SLOTWATCH_ALERT_WEBHOOK_URL": h.srv.URL,
	})
	slot := map[string]string{"slot": "doomed"}
	eventually(t, 5*time.Second, func() (bool, string) {
		_, ok := sw.metric(t, "slotwatch_slot_safe_wal_size_bytes", slot)
		return ok, "safe_wal_size not exported"
	})

	// Write WAL steadily (about 10 MiB/s) while sampling the time to
	// invalidation, until the slot is unreserved.
	ctx, cancel := context.WithCancel(context.Background())
	writer := make(chan error, 1)
	wc := pg.Conn(t, "outbox")
	go func() {
		c := wc
		for i := 0; i < 200 && ctx.Err() == nil; i++ {
			if _, err := c.Exec(ctx, "SELECT pg_logical_emit_message(true, 'slotwatch-test', repeat('x', 1048576))"); err != nil && ctx.Err() == nil {
				writer <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		writer <- nil
	}()
	var tti []float64
	eventually(t, 30*time.Second, func() (bool, string) {
		fams := sw.scrape(t)
		if v, ok := value(fams, "slotwatch_slot_wal_status", map[string]string{"slot": "doomed", "status": "unreserved"}); ok && v == 1 {
			return true, ""
		}
		if v, ok := value(fams, "slotwatch_slot_time_to_invalidation_seconds", slot); ok && !math.IsInf(v, 1) {
			if len(tti) == 0 || tti[len(tti)-1] != v {
				tti = append(tti, v)
			}
		}
		return false, "slot not unreserved"
	})
	cancel()
	if err := <-writer; err != nil {
		t.Fatal(err)
	}
	t.Logf("time to invalidation while reserved: %.2f", tti)
	if len(tti) < 3 {
		t.Fatalf("only %d samples of the time to invalidation before the slot was unreserved", len(tti))
	}
	if last := tti[len(tti)-1]; !(last < tti[0]/2) || last > 3 {
		t.Errorf("time to invalidation did not fall toward zero: first %.2fs, last %.2fs", tti[0], last)
	}
	if v, _ := sw.metric(t, "slotwatch_slot_time_to_invalidation_seconds", slot); v != 0 {
		// Once unreserved, safe_wal_size is negative: no time left.
		eventually(t, 2*time.Second, func() (bool, string) {
			v, _ := sw.metric(t, "slotwatch_slot_time_to_invalidation_seconds", slot)
			return v == 0, "time to invalidation not 0 once unreserved"
		})
	}
	unreserved := h.waitFor(t, "SlotWALUnreserved", "doomed", "firing", 5*time.Second)
	checkWebhookFormat(t, unreserved, "critical")

	// The next checkpoint removes the WAL: the slot is lost.
	execAll(t, pg, "outbox", "CHECKPOINT")
	lost := h.waitFor(t, "SlotInvalidated", "doomed", "firing", 5*time.Second)
	checkWebhookFormat(t, lost, "critical")
	a := lost.Alerts[0]
	if a.Labels["reason"] != "wal_removed" || !strings.Contains(a.Annotations["recovery"], "pg_drop_replication_slot('doomed')") ||
		!strings.Contains(a.Annotations["description"], "doomed") {
		t.Errorf("SlotInvalidated does not name the slot, reason and recovery: %v %v", a.Labels, a.Annotations)
	}
	iu, _ := h.find("SlotWALUnreserved", "doomed", "firing")
	il, _ := h.find("SlotInvalidated", "doomed", "firing")
	if !(iu >= 0 && il > iu) {
		t.Errorf("critical alerts out of order: %s", h.summary())
	}
	h.waitFor(t, "SlotWALUnreserved", "doomed", "resolved", 5*time.Second)
	fams := sw.scrape(t)
	if v, _ := value(fams, "slotwatch_slot_wal_status", map[string]string{"slot": "doomed", "status": "lost"}); v != 1 {
		t.Errorf("wal_status lost not exported")
	}
	if v, ok := value(fams, "slotwatch_slot_time_to_invalidation_seconds", slot); !ok || v != 0 {
		t.Errorf("time to invalidation of a lost slot = %v (present %v), want 0", v, ok)
	}
	if v, _ := value(fams, "slotwatch_slot_invalidated", map[string]string{"slot": "doomed", "reason": "wal_removed"}); v != 1 {
		t.Errorf("slotwatch_slot_invalidated{reason=wal_removed} not 1")
	}
}

// Acceptance: an inactive slot raises SlotInactive after its for-duration;
// catalog_xmin age is exported and alerted. An active slot raises nothing.
func TestInactiveSlotAndCatalogXmin(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	execAll(t, pg, "outbox",
		"SELECT pg_create_logical_replication_slot('idle', 'pgoutput')",
		"SELECT pg_create_logical_replication_slot('busy', 'test_decoding')")
	cmd := exec.Command(filepath.Join(pg.BinDir, "pg_recvlogical"), "-d", pg.DSN("outbox"), "-S", "busy", "--start", "-f", "/dev/null", "-s", "1")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatalf("pg_recvlogical: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	h := newHook(t)
	start := time.Now()
	const inactiveAfter, alertFor = time.Second, time.Second
	sw := startSlotwatch(t, map[string]string{
		"SLOTWATCH_PG_DSN":             pg.DSN("outbox"),
		"SLOTWATCH_INTERVAL":           "200ms",
		"SLOTWATCH_INACTIVE_WARN_TIME": inactiveAfter.String(),
		"SLOTWATCH_XMIN_AGE_WARN":      "50",
		"SLOTWATCH_ALERT_FOR":          alertFor.String(),
		"SLOTWATCH_ALERT_WEBHOOK_URL":  h.srv.URL,
	})
	eventually(t, 10*time.Second, func() (bool, string) {
		v, ok := sw.metric(t, "slotwatch_slot_active", map[string]string{"slot": "busy"})
		return ok && v == 1, "busy slot not active"
	})

	m := h.waitFor(t, "SlotInactive", "idle", "firing", 10*time.Second)
	checkWebhookFormat(t, m, "warning")
	// Inactive for the threshold, then the condition held for its for-duration.
	if waited := time.Since(start); waited < inactiveAfter+alertFor {
		t.Errorf("SlotInactive fired after %s, before threshold + for-duration (%s)", waited, inactiveAfter+alertFor)
	}
	if v, _ := sw.metric(t, "slotwatch_slot_inactive_seconds", map[string]string{"slot": "idle"}); v < inactiveAfter.Seconds() {
		t.Errorf("slotwatch_slot_inactive_seconds = %v", v)
	}

	// Consume transaction ids: the idle slot's catalog_xmin ages.
	c := pg.Conn(t, "outbox")
	for i := 0; i < 60; i++ {
		if _, err := c.Exec(context.Background(), "SELECT txid_current()"); err != nil {
			t.Fatal(err)
		}
	}
	var dbAge float64
	if err := c.QueryRow(context.Background(), "SELECT age(catalog_xmin) FROM pg_replication_slots WHERE slot_name = 'idle'").Scan(&dbAge); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		v, ok := sw.metric(t, "slotwatch_slot_catalog_xmin_age", map[string]string{"slot": "idle"})
		return ok && v >= dbAge, "catalog_xmin age not exported"
	})
	x := h.waitFor(t, "SlotCatalogXminAgeHigh", "idle", "firing", 10*time.Second)
	checkWebhookFormat(t, x, "warning")
	if n := h.count("SlotInactive", "busy", "firing"); n != 0 {
		t.Errorf("SlotInactive fired for the streamed slot")
	}
	// pg_stat_replication joins the active slot.
	_, body := sw.get(t, "/slots")
	var servers []web.ServerView
	if err := json.Unmarshal([]byte(body), &servers); err != nil {
		t.Fatal(err)
	}
	var sawSender bool
	for _, s := range servers[0].Slots {
		if s.Name == "busy" && s.Sender != nil && s.Sender.ApplicationName == "pg_recvlogical" {
			sawSender = true
		}
	}
	if !sawSender {
		t.Errorf("/slots has no WAL sender for the busy slot:\n%s", body)
	}
}

// Acceptance: the database stopped and restarted: slotwatch keeps serving,
// alerts DatabaseUnreachable, recovers by itself. The DSN's password never
// shows.
func TestDatabaseDownAndBack(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	execAll(t, pg, "outbox", "SELECT pg_create_logical_replication_slot('keep', 'pgoutput')")
	h := newHook(t)
	const secret = "s3cr3t-Pw"
	// Trust authentication ignores the password; it is here to be hidden.
	dsn := strings.Replace(pg.DSN("outbox"), "postgres@", "postgres:"+secret+"@", 1)
	sw := startSlotwatch(t, map[string]string{
		"SLOTWATCH_PG_DSN":            "primary=" + dsn,
		"SLOTWATCH_INTERVAL":          "200ms",
		"SLOTWATCH_TIMEOUT":           "1s",
		"SLOTWATCH_ALERT_FOR":         "500ms",
		"SLOTWATCH_ALERT_WEBHOOK_URL": h.srv.URL,
	})
	up := map[string]string{"server": "primary", "database": "outbox"}
	eventually(t, 5*time.Second, func() (bool, string) {
		v, ok := sw.metric(t, "slotwatch_up", up)
		return ok && v == 1, "not up"
	})

	if err := pg.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		v, ok := sw.metric(t, "slotwatch_up", up)
		return ok && v == 0, "slotwatch_up not 0"
	})
	m := h.waitFor(t, "DatabaseUnreachable", "", "firing", 10*time.Second)
	checkWebhookFormat(t, m, "critical")
	if l := m.Alerts[0].Labels; l["server"] != "primary" || l["database"] != "outbox" {
		t.Errorf("labels %v", l)
	}
	// Still serving everything while the database is down.
	pages := map[string]string{}
	for _, p := range []string{"/healthz", "/slots", "/", "/metrics"} {
		code, body := sw.get(t, p)
		if code != 200 {
			t.Errorf("%s: %d while the database is down", p, code)
		}
		pages[p] = body
	}
	if parsed, err := webtest.Parse(strings.NewReader(pages["/"])); err != nil || parsed.Rows["server/primary"].Level != "down" {
		t.Errorf("status page while down: %v %+v", err, parsed)
	}
	if _, ok := sw.metric(t, "slotwatch_slot_lag_bytes", map[string]string{"slot": "keep"}); ok {
		t.Errorf("stale slot metrics exported while the database is down")
	}

	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		v, _ := sw.metric(t, "slotwatch_up", up)
		return v == 1, "slotwatch_up not back to 1"
	})
	h.waitFor(t, "DatabaseUnreachable", "", "resolved", 5*time.Second)
	eventually(t, 5*time.Second, func() (bool, string) {
		_, ok := sw.metric(t, "slotwatch_slot_lag_bytes", map[string]string{"slot": "keep", "server": "primary"})
		return ok, "slot metrics not back"
	})
	for p, body := range pages {
		if strings.Contains(body, secret) {
			t.Errorf("%s shows the password", p)
		}
	}
	if strings.Contains(h.rawText(), secret) {
		t.Errorf("a notification shows the password")
	}
	if strings.Contains(sw.log.String(), secret) {
		t.Errorf("the log shows the password")
	}
}
