package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/slotwatch/web"
)

// TestFailoverReadiness (PostgreSQL 17): a primary with a failover slot and
// a physical standby of it, both watched. While the standby does not
// synchronize slots, the copy is missing: slotwatch_slot_failover_ready is 0
// (reason missing) and SlotNotFailoverReady fires. Once the standby
// synchronizes it the copy is there, but the primary's
// synchronized_standby_slots does not name the standby's physical slot, so
// decoding may hand out changes the standby lacks: still 0
// (standby-slot-unlisted; issue 35, item 17: it read 1). Named there, ready
// is 1 and the alert resolves. hot_standby_feedback off on the standby: 0
// again (no-hot-standby-feedback), the alert fires and resolves when it is
// back on. The standby stops synchronizing and the primary's slot moves on
// past SLOTWATCH_FAILOVER_LAG_BYTES: the alert fires again (reason behind),
// and resolves when synchronization catches the copy up.
func TestFailoverReadiness(t *testing.T) {
	bin, err := testenv.PGVersionBinDir(17)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL 17: %v", err)
	}
	primary := testenv.StartPostgres(t, testenv.PGOptions{BinDir: bin, NoSchema: true})
	execAll(t, primary, "outbox", "SELECT pg_create_physical_replication_slot('standby1', true)")
	standby := primary.StartStandby(t, map[string]string{"primary_slot_name": "'standby1'", "hot_standby_feedback": "on", "sync_replication_slots": "off"})
	execAll(t, standby, "postgres", "SELECT pg_drop_replication_slot('standby1')")
	execAll(t, primary, "outbox", "SELECT pg_create_logical_replication_slot('outbox_slot', 'pgoutput', false, false, true)")

	h := newHook(t)
	sw := startSlotwatch(t, map[string]string{
		"SLOTWATCH_PG_DSN":             fmt.Sprintf("primary=%s standby=%s", primary.DSN("outbox"), standby.DSN("outbox")),
		"SLOTWATCH_INTERVAL":           "200ms",
		"SLOTWATCH_ALERT_FOR":          "600ms",
		"SLOTWATCH_FAILOVER_LAG_BYTES": "4194304", // 4 MiB
		"SLOTWATCH_ALERT_WEBHOOK_URL":  h.srv.URL + "/hook",
	})
	ready := map[string]string{"server": "primary", "slot": "outbox_slot", "standby": "standby"}
	syncSlots := func(on string) {
		execAll(t, standby, "postgres", "ALTER SYSTEM SET sync_replication_slots = "+on, "SELECT pg_reload_conf()")
	}

	// Missing.
	eventually(t, 10*time.Second, func() (bool, string) {
		v, ok := sw.metric(t, "slotwatch_slot_failover_ready", ready)
		return ok && v == 0, "no slotwatch_slot_failover_ready 0 yet"
	})
	fired := h.waitFor(t, "SlotNotFailoverReady", "outbox_slot", "firing", 10*time.Second)
	checkWebhookFormat(t, fired, "warning")
	if l := fired.Alerts[0].Labels; l["standby"] != "standby" || l["server"] != "primary" {
		t.Errorf("labels %v", l)
	}
	if s := fired.Alerts[0].Annotations["summary"]; !strings.Contains(s, "(missing)") {
		t.Errorf("summary %q does not say the copy is missing", s)
	}

	// Synchronized, but the primary does not wait for the standby: not
	// ready, the alert still firing.
	syncSlots("on")
	eventually(t, 90*time.Second, func() (bool, string) {
		var synced, temporary bool
		err := standby.Conn(t, "outbox").QueryRow(context.Background(), "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = 'outbox_slot'").Scan(&synced, &temporary)
		return err == nil && synced && !temporary, fmt.Sprintf("the standby's copy: synced %v, temporary %v, %v", synced, temporary, err)
	})
	eventually(t, 10*time.Second, func() (bool, string) {
		reason, ok := failoverReason(t, sw, "primary", "outbox_slot", "standby")
		v, _ := sw.metric(t, "slotwatch_slot_failover_ready", ready)
		return ok && reason == "standby-slot-unlisted" && v == 0, fmt.Sprintf("reason %q (reported %v), ready %v; want standby-slot-unlisted, 0", reason, ok, v)
	})
	time.Sleep(time.Second) // a few intervals: it stays so
	if v, _ := sw.metric(t, "slotwatch_slot_failover_ready", ready); v != 0 || h.count("SlotNotFailoverReady", "outbox_slot", "resolved") != 0 {
		t.Fatalf("ready %v, notifications %s: want 0 and the alert still firing", v, h.summary())
	}

	// The primary waits for the standby's physical slot: ready, resolved.
	execAll(t, primary, "outbox", "ALTER SYSTEM SET synchronized_standby_slots = 'standby1'", "SELECT pg_reload_conf()")
	eventually(t, 30*time.Second, func() (bool, string) {
		v, ok := sw.metric(t, "slotwatch_slot_failover_ready", ready)
		return ok && v == 1, "not ready yet"
	})
	h.waitFor(t, "SlotNotFailoverReady", "outbox_slot", "resolved", 10*time.Second)

	// No hot_standby_feedback on the standby: not ready, fires; back on:
	// resolved.
	feedback := func(on string) {
		execAll(t, standby, "postgres", "ALTER SYSTEM SET hot_standby_feedback = "+on, "SELECT pg_reload_conf()")
	}
	feedback("off")
	eventually(t, 10*time.Second, func() (bool, string) {
		return h.countReason("SlotNotFailoverReady", "(no-hot-standby-feedback)", "firing") == 1, "no firing SlotNotFailoverReady (no-hot-standby-feedback): " + h.summary()
	})
	if v, _ := sw.metric(t, "slotwatch_slot_failover_ready", ready); v != 0 {
		t.Errorf("ready %v without hot_standby_feedback, want 0", v)
	}
	feedback("on")
	eventually(t, 30*time.Second, func() (bool, string) {
		return h.countReason("SlotNotFailoverReady", "(no-hot-standby-feedback)", "resolved") == 1, "no resolved SlotNotFailoverReady (no-hot-standby-feedback): " + h.summary()
	})

	// Behind: the standby stops synchronizing, the primary's slot moves on.
	syncSlots("off")
	time.Sleep(time.Second)
	writeWAL(t, primary, 8)
	execAll(t, primary, "outbox", "SELECT pg_replication_slot_advance('outbox_slot', pg_current_wal_lsn())")
	eventually(t, 30*time.Second, func() (bool, string) {
		v, ok := sw.metric(t, "slotwatch_slot_failover_lag_bytes", map[string]string{"server": "primary", "slot": "outbox_slot", "standby": "standby"})
		return ok && v > 4<<20, fmt.Sprintf("lag %.0f (present %v)", v, ok)
	})
	eventually(t, 10*time.Second, func() (bool, string) {
		return h.countReason("SlotNotFailoverReady", "behind", "firing") == 1, "no firing SlotNotFailoverReady (behind): " + h.summary()
	})

	// Caught up: resolved.
	syncSlots("on")
	eventually(t, 90*time.Second, func() (bool, string) {
		return h.countReason("SlotNotFailoverReady", "behind", "resolved") == 1, "no resolved SlotNotFailoverReady (behind): " + h.summary()
	})
	lag, _ := sw.metric(t, "slotwatch_slot_failover_lag_bytes", map[string]string{"server": "primary", "slot": "outbox_slot", "standby": "standby"})
	t.Logf("notifications %s; lag after catching up %.0f bytes", h.summary(), lag)
	var synced bool
	if err := standby.Conn(t, "outbox").QueryRow(context.Background(), "SELECT synced FROM pg_replication_slots WHERE slot_name = 'outbox_slot'").Scan(&synced); err != nil || !synced {
		t.Errorf("the standby's copy: synced %v, %v", synced, err)
	}
}

// failoverReason is the reason /slots gives why failover slot slot of server
// is not ready on standby ("" when ready), and whether /slots reports it.
func failoverReason(t testing.TB, sw *instance, server, slot, standby string) (string, bool) {
	t.Helper()
	_, body := sw.get(t, "/slots")
	var servers []web.ServerView
	if err := json.Unmarshal([]byte(body), &servers); err != nil {
		t.Fatalf("/slots: %v", err)
	}
	for _, s := range servers {
		if s.Server != server {
			continue
		}
		for _, f := range s.Failover {
			if f.Slot == slot && f.Standby == standby {
				return f.Reason, true
			}
		}
	}
	return "", false
}

// countReason counts notifications about alertname whose first alert's
// summary says reason, with the given status.
func (h *hook) countReason(alertname, reason, status string) int {
	n := 0
	for _, m := range h.messages() {
		if len(m.Alerts) > 0 && m.Alerts[0].Labels["alertname"] == alertname && strings.Contains(m.Alerts[0].Annotations["summary"], reason) && m.Status == status {
			n++
		}
	}
	return n
}
