package main

import (
	"strings"
	"testing"
	"time"
)

// Without Kafka transactions (OUTBOX_KAFKA_TRANSACTIONAL=false) nothing at
// the broker fences a deposed leader, so a standby must not take over before
// the old lease has expired by the database's clock, even when it sees the
// old leader's lease session gone (kill -9, a cut connection). The leader
// renews every third of the TTL, so the old lease expires at least two
// thirds of the TTL after the fault: no takeover may come sooner.

// idempotentTakeover checks one idempotent-mode takeover: not before the
// old lease can have expired, and taken as an expired lease.
func idempotentTakeover(t *testing.T, took durations, fault string) {
	t.Helper()
	floor := haTTL - haTTL/3
	t.Logf("idempotent %s takeovers: %s (TTL %s; the old lease expires at least %s after the fault)", fault, took, haTTL, floor)
	for _, d := range took {
		if d < floor {
			t.Errorf("takeover %s after the %s, before the old lease can have expired (%s): two publishers without a fence", d, fault, floor)
		}
		if d > haTTL+15*time.Second {
			t.Errorf("takeover took %s after the %s; want within TTL + 15 s", d, fault)
		}
	}
}

// expiredFault wraps fault: the instance that takes over must have taken
// the lease as expired (not because the holder's session ended).
func expiredFault(fault faultFunc) faultFunc {
	return func(c *haCluster, old *haNode, oldTok int64) (time.Duration, *haNode, int64) {
		c.t.Helper()
		d, n, tok := fault(c, old, oldTok)
		var line string
		for _, l := range strings.Split(n.proc.Output(), "\n") {
			if strings.Contains(l, "acquired the leader lease") {
				line = l
			}
		}
		if !strings.Contains(line, "expired") {
			c.t.Errorf("%s took over with %q; want the lease taken as expired", n.name, line)
		}
		return d, n, tok
	}
}

// TestHAKill9Idempotent: in idempotent mode the leader killed with SIGKILL
// under load: a standby takes over only once the old lease expired (about a
// TTL later, not at once), nothing is lost, first deliveries per aggregate
// stay in order, and no record of the old token follows one of the new.
func TestHAKill9Idempotent(t *testing.T) {
	took, dups := runHA(t, 2, 1, expiredFault(faultKill), "OUTBOX_KAFKA_TRANSACTIONAL", "false")
	idempotentTakeover(t, took, "kill -9")
	t.Logf("%d duplicates", dups)
}

// TestHAConnectionCutIdempotent: in idempotent mode the leader's lease
// session and walsender ended by the server, the process alive: it steps
// down, and a standby (not the old leader) takes over once the lease expired.
func TestHAConnectionCutIdempotent(t *testing.T) {
	took, _ := runHA(t, 2, 1, expiredFault(faultCut), "OUTBOX_KAFKA_TRANSACTIONAL", "false")
	idempotentTakeover(t, took, "cut")
}
