package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// findings is the report's analysis, computed from this run's numbers: what
// limits each goal, and where the connector's time goes.
func findings(res *Results) string {
	var out []string
	add := func(format string, args ...any) { out = append(out, "- "+fmt.Sprintf(format, args...)) }

	// Drain.
	for _, tx := range res.Settings.TxSizes {
		recv := findSummary(res, sysRecv, tx)
		if recv == nil {
			continue
		}
		recvCPU := recv.WalsenderCPU + recv.CPUPer100k
		add("**Drain, %d event(s) per transaction.** pg_recvlogical: %.0f events/s; it and its walsender (PostgreSQL's decoding) use %.2f CPU s per 100k events, and Kafka nothing.",
			tx, recv.EventsPerSec, recvCPU)
		for _, v := range res.Variants {
			c := findSummary(res, v.Name, tx)
			if c == nil {
				continue
			}
			var txns, commitShare, commitMS []float64
			for _, d := range res.Drains {
				if d.System == v.Name && d.TxSize == tx && d.Error == "" && d.KafkaTxns > 0 {
					txns = append(txns, d.KafkaTxns)
					commitShare = append(commitShare, d.KafkaTxnCommitSeconds/d.Seconds)
					commitMS = append(commitMS, 1000*d.KafkaTxnCommitSeconds/d.KafkaTxns)
				}
			}
			pipeCPU := c.WalsenderCPU + c.CPUPer100k + c.BrokerCPU
			line := fmt.Sprintf("  - `%s`: %.0f events/s, %.2fx pg_recvlogical. The pipeline uses %.2f CPU s per 100k events, %.1fx pg_recvlogical's: walsender %.2f, connector %.2f (%.0f%% of one CPU while draining), Kafka broker %.2f",
				v.Name, c.EventsPerSec, c.EventsPerSec/recv.EventsPerSec, pipeCPU, pipeCPU/recvCPU, c.WalsenderCPU, c.CPUPer100k, 100*c.CPUUtil, c.BrokerCPU)
			if len(txns) > 0 {
				n := median(txns)
				line += fmt.Sprintf("; it ended %.0f Kafka transactions per drain (%.0f events each), each commit taking %.1f ms on average, %.0f%% of the drain time (a flush of the transaction's records, then EndTxn; nothing is produced meanwhile)",
					n, float64(res.Settings.Events)/n, median(commitMS), 100*median(commitShare))
			}
			out = append(out, line+".")
		}
	}
	if m := res.Machine.CPUs; m > 0 && findSummary(res, sysRecv, res.Settings.TxSizes[0]) != nil {
		add("With %d CPUs shared by PostgreSQL, Kafka, the relay and other work, a relay whose pipeline (walsender + relay + broker) needs twice pg_recvlogical's CPU per event cannot drain as fast on this machine: reaching 0.9x needs the relay's and the broker's CPU per event to come down (bigger batches, fewer requests and wake-ups), besides removing the relay's waiting.", m)
	}

	// Latency.
	for _, rate := range res.Settings.Rates {
		floor := findLatency(res, sysFloor, rate)
		var parts []string
		for _, sys := range append(connectorSystems(res), sysDebezium) {
			l := findLatency(res, sys, rate)
			if l == nil {
				continue
			}
			s := fmt.Sprintf("`%s` p50/p99 %.1f/%.1f ms", sys, l.CommitToConsumer.P50, l.CommitToConsumer.P99)
			if floor != nil {
				s += fmt.Sprintf(" (%+.1f/%+.1f against the floor)", l.CommitToConsumer.P50-floor.CommitToConsumer.P50, l.CommitToConsumer.P99-floor.CommitToConsumer.P99)
			}
			parts = append(parts, s)
		}
		if floor == nil || len(parts) == 0 {
			continue
		}
		line := fmt.Sprintf("**Latency at %d events/s**, commit → consumer: the floor (bare relay) p50/p99 %.1f/%.1f ms, of which PostgreSQL's delivery %s and the writers' COMMIT p99 %.1f ms; %s.",
			rate, floor.CommitToConsumer.P50, floor.CommitToConsumer.P99, recvText(floor), floor.CommitDuration.P99, strings.Join(parts, "; "))
		if floor.CommitToConsumer.P99 >= 10 {
			line += " The floor itself misses 10 ms at p99 here: on the shared CPUs the tail is scheduling delay (PostgreSQL's delivery alone has it), so tails measured seconds apart differ by noise as much as by design; the medians are the steadier comparison."
		}
		if c := findLatency(res, sysConnector, rate); c != nil && c.CommitToConsumer.P50 > 2*c.CommitToAck.P50+2 {
			line += fmt.Sprintf(" `%s`'s records are in Kafka after p50 %.1f ms but acknowledged (their Kafka transaction committed, visible to read_committed consumers) after p50 %.1f ms: its latency is the Kafka transaction's batching and commit round trip.",
				sysConnector, c.CommitToAck.P50, c.CommitToConsumer.P50)
		}
		add("%s", line)
	}

	// Memory.
	var peaks []string
	for _, v := range res.Variants {
		if drain, _ := peakRSS(res, v.Name); drain > 0 {
			peaks = append(peaks, fmt.Sprintf("`%s` %s", v.Name, mib(drain)))
		}
	}
	if len(peaks) > 0 {
		add("**Memory during the drains** (goal < 64 MiB): %s. The records buffered for Kafka are bounded by OUTBOX_MAX_IN_FLIGHT (10,000 records) and 16 MiB, so the peak does not grow with the backlog, and the connector gives the Go runtime a soft memory limit of 40 MiB (GOMEMLIMIT overrides it), so the heap does not double before each collection.", strings.Join(peaks, ", "))
	}

	// Profiles.
	for _, pr := range res.Profiles {
		if pr.Error != "" {
			continue
		}
		top := topEntries(pr.TopCPU, 6)
		add("**Profile, `%s`, %d/tx:** %.1f allocations and %.0f bytes per event; %.0f%% of one CPU busy. Top flat CPU: %s. %s",
			pr.Variant, pr.TxSize, pr.AllocsPerEv, pr.BytesPerEv, 100*pr.Drain.CPUSeconds/math.Max(pr.Drain.Seconds, 1e-9), strings.Join(top, ", "), profileNotes(pr))
	}
	if len(out) == 0 {
		return "No results to analyse."
	}
	return strings.Join(out, "\n") + "\n\n### What to change in the connector\n\n" + suggestions(res)
}

// suggestions lists the changes the evidence of this run points at, each
// with its evidence; a suggestion whose evidence is missing is left out.
func suggestions(res *Results) string {
	var out []string
	n := 0
	add := func(format string, args ...any) {
		n++
		out = append(out, fmt.Sprintf("%d. ", n)+fmt.Sprintf(format, args...))
	}
	// 1. Kafka transactions: the commit stall.
	var share, perTxn []float64
	for _, d := range res.Drains {
		if d.System == sysConnector && d.Error == "" && d.KafkaTxns > 0 {
			share = append(share, d.KafkaTxnCommitSeconds/d.Seconds)
			perTxn = append(perTxn, float64(d.Events)/d.KafkaTxns)
		}
	}
	if len(share) > 0 && median(share) >= 0.1 {
		line := fmt.Sprintf("**Keep reading while a Kafka transaction commits** (`relay/publish/txn.go`). In the drains the connector committed every %.0f events (median) and spent %.0f%% of the drain time committing (a flush of the transaction's records, then EndTxn, with nothing produced meanwhile); the stream reads on while a commit runs until its hand-over to the producer (`handOver` in `relay.go`, 4,096 events) is full; a longer commit stalls reading, and the walsender with it. Producing the next transaction's records while the previous one commits is not possible with one transactional producer (KIP-890); two producers alternating, or larger transactions under load, would hide the rest.",
			median(perTxn), 100*median(share))
		add("%s", line)
	}
	// 1b. Kafka transactions: the latency they add.
	{
		var parts []string
		for _, rate := range res.Settings.Rates {
			c := findLatency(res, sysConnector, rate)
			if c == nil || c.ConnectorHistogram == nil || c.ConnectorHistogram.Within10ms == nil {
				continue
			}
			part := fmt.Sprintf("%d/s: in Kafka p50 %.1f ms, acked p50 %.1f ms, %.0f%% acked within 10 ms", rate, c.CommitToAck.P50, c.ConnectorHistogram.P50, 100**c.ConnectorHistogram.Within10ms)
			for _, alt := range []string{sysConnectorIdem, sysConnectorLinger, sysConnectorLinger0} {
				if a := findLatency(res, alt, rate); a != nil && a.ConnectorHistogram != nil && a.ConnectorHistogram.Within10ms != nil {
					part += fmt.Sprintf(" (`%s`: %.0f%%)", alt, 100**a.ConnectorHistogram.Within10ms)
				}
			}
			parts = append(parts, part)
		}
		if len(parts) > 0 && len(res.Variants) > 1 {
			add("**Bound what a Kafka transaction adds to latency.** Records reach Kafka in milliseconds, but count as acknowledged only when their transaction commits, after the transaction's linger and one flush-plus-EndTxn round trip: %s. For the < 10 ms p99 goal the commit has to leave the critical path: commit on a short, latency-budgeted schedule (a few ms, not up to OUTBOX_KAFKA_TXN_INTERVAL=100ms) while loaded, or, where broker-side fencing is not required, run without transactions (the lease fences) with a 1 ms linger.",
				strings.Join(parts, "; "))
		}
	}
	// 2. Allocations per event.
	for _, pr := range res.Profiles {
		if pr.Error != "" || pr.TxSize != 1 {
			continue
		}
		sites := allocSites(pr.TopAllocObj, float64(pr.Drain.Events))
		if len(sites) == 0 {
			continue
		}
		advice := []struct{ site, text string }{
			{"(*Stream).row", "copy rows' bytes into a shared arena per read instead of one buffer per row in `wal.(*Stream).row` (the row and its columns are already one allocation)"},
			{"(*Router).route", "let the router alias the row's payload (already a private copy) instead of copying it into the record"},
			{"(*Tracker).Begin", "recycle `tracker.Txn`s (one allocation per PostgreSQL transaction)"},
			{"(*Producer).produce", "avoid the per-record promise closure of the idempotent producer in `publish.(*Producer).produce` (the transactional producer already shares one promise)"},
		}
		var todo []string
		joined := strings.Join(sites, " ")
		for _, a := range advice {
			if strings.Contains(joined, a.site) {
				todo = append(todo, a.text)
			}
		}
		line := fmt.Sprintf("**Allocate less per event** (`%s`: %.1f allocations, %.0f bytes per event over the process's life). Sampled allocations per event by site: %s.",
			pr.Variant, pr.AllocsPerEv, pr.BytesPerEv, strings.Join(sites, ", "))
		if len(todo) > 0 {
			line += " Candidates: " + strings.Join(todo, "; ") + "."
		}
		add("%s", line)
		break
	}
	// 3. System calls and deadlines on the replication connection.
	for _, pr := range res.Profiles {
		if pr.Error != "" || pr.Variant != sysConnectorIdem || pr.TxSize != 1 {
			continue
		}
		sys, _ := cumShare(pr.TopCPUCum, "Syscall6")
		read, _ := cumShare(pr.TopCPUCum, "chunkReader).Next")
		dl, _ := cumShare(pr.TopCPUCum, "SetReadDeadline")
		sched, _ := cumShare(pr.TopCPUCum, "runtime.findRunnable")
		if sys < 5 && sched < 5 {
			continue // the profile shows no such cost
		}
		dlText := ""
		if dl > 0 {
			dlText = fmt.Sprintf(", setting the read deadline %.0f%%", dl)
		}
		add("**Fewer system calls and wake-ups per event** (`%s` profile: system calls %.0f%% of CPU, reading the replication stream %.0f%%, the scheduler looking for work %.0f%%%s). The read deadline is set only when it changes and the replication connection reads through a 256 KiB buffer; what is left: handing events to the producer in slices (per transaction or per read) instead of one channel send per event, to cut the goroutine wake-ups.",
			pr.Variant, sys, read, sched, dlText)
	}
	// 4. Batching: linger.
	// zero and one are the idempotent producer with linger 0 and 1 ms,
	// whichever of them is the binary's default.
	zero, one := sysConnectorIdem, sysConnectorLinger
	if findSummary(res, sysConnectorLinger0, 1) != nil {
		zero, one = sysConnectorLinger0, sysConnectorIdem
	}
	idem1, ling1 := findSummary(res, zero, 1), findSummary(res, one, 1)
	if idem1 != nil && ling1 != nil {
		var drains, lats []string
		for _, tx := range res.Settings.TxSizes {
			a, b := findSummary(res, zero, tx), findSummary(res, one, tx)
			if a != nil && b != nil {
				drains = append(drains, fmt.Sprintf("%d/tx %.0f against %.0f events/s, connector %.2f against %.2f and broker %.2f against %.2f CPU s per 100k events",
					tx, b.EventsPerSec, a.EventsPerSec, b.CPUPer100k, a.CPUPer100k, b.BrokerCPU, a.BrokerCPU))
			}
		}
		for _, rate := range res.Settings.Rates {
			if a, b := findLatency(res, zero, rate), findLatency(res, one, rate); a != nil && b != nil {
				lats = append(lats, fmt.Sprintf("%d/s p50/p99 %.1f/%.1f against %.1f/%.1f ms", rate, b.CommitToConsumer.P50, b.CommitToConsumer.P99, a.CommitToConsumer.P50, a.CommitToConsumer.P99))
			}
		}
		add("**Batch produce requests.** With linger 0 and five produce requests in flight, franz-go may send many small requests: more system calls in the connector and more work for the broker, which shares the CPUs with PostgreSQL; a 1 ms linger (the default) trades that for up to a millisecond. Measured here, the idempotent producer with OUTBOX_KAFKA_LINGER=1ms against linger 0: drains %s; latency (commit → consumer) %s. Drains of a few seconds on the shared machine vary by up to 2x between repeats (see min–max): compare the medians with care.",
			strings.Join(drains, "; "), strings.Join(lats, "; "))
	}
	// 5. Memory bound.
	var over []string
	for _, v := range res.Variants {
		if drain, _ := peakRSS(res, v.Name); drain >= 64<<20 {
			over = append(over, fmt.Sprintf("`%s` %s", v.Name, mib(drain)))
		}
	}
	if len(over) > 0 {
		add("**Bound buffered bytes, not only records** (peak RSS over 64 MiB: %s). The producer buffers at most OUTBOX_MAX_IN_FLIGHT records (10,000) and 16 MiB, the hand-over 4,096 decoded events, and the Go runtime has a soft limit of 40 MiB; what is over it is the binary, the runtime and the buffers outside the Go heap. A lower GOMEMLIMIT or OUTBOX_MAX_IN_FLIGHT trades CPU (more collection) or throughput for it.",
			strings.Join(over, ", "))
	}
	if len(out) == 0 {
		return "Nothing measured points at a change."
	}
	return strings.Join(out, "\n")
}

// allocSites reads the allocation sites of an alloc_objects listing and
// divides their sampled counts by the events.
func allocSites(top string, events float64) []string {
	if events <= 0 {
		return nil
	}
	var out []string
	for _, line := range strings.Split(top, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") || f[0] == "flat" {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil || v/events < 0.05 {
			continue
		}
		out = append(out, fmt.Sprintf("`%s` %.2f", shortFunc(strings.Join(f[5:], " ")), v/events))
		if len(out) == 8 {
			break
		}
	}
	return out
}

func recvText(l *LatencyRun) string {
	if l.CommitToReceived == nil {
		return "n/a"
	}
	return fmt.Sprintf("p50/p99 %.1f/%.1f ms", l.CommitToReceived.P50, l.CommitToReceived.P99)
}

// topEntries reads the first n entries of a `go tool pprof -top` listing:
// "function flat%".
func topEntries(top string, n int) []string {
	var out []string
	for _, line := range strings.Split(top, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") || f[0] == "flat" {
			continue
		}
		out = append(out, fmt.Sprintf("`%s` %s", shortFunc(strings.Join(f[5:], " ")), f[1]))
		if len(out) == n {
			break
		}
	}
	return out
}

// cumShare finds the cumulative share of the first function matching substr
// in a `-top -cum` listing.
func cumShare(top, substr string) (float64, bool) {
	for _, line := range strings.Split(top, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[4], "%") || !strings.Contains(line, substr) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSuffix(f[4], "%"), 64)
		return v, err == nil
	}
	return 0, false
}

func shortFunc(s string) string {
	s = strings.TrimSuffix(s, " (inline)")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// profileNotes points at the per-event costs the cumulative profile shows.
func profileNotes(pr ProfileResult) string {
	var notes []string
	for _, c := range []struct{ substr, what string }{
		{"SetReadDeadline", "setting the replication connection's read deadline before every message"},
		{"Syscall6", "system calls (socket reads and writes, futex wake-ups)"},
		{"mallocgc", "allocation"},
		{"runtime.gcBgMarkWorker", "the garbage collector"},
		{"(*Stream).row", "copying each row out of the connection's buffer"},
		{"(*Router).Route", "routing (outbox row to Kafka record)"},
		{"compressor", "lz4 compression"},
		{"poisonKey", "building a poison-lookup key per record"},
	} {
		if v, ok := cumShare(pr.TopCPUCum, c.substr); ok && v >= 3 {
			notes = append(notes, fmt.Sprintf("%s %.0f%%", c.what, v))
		}
	}
	if len(notes) == 0 {
		return ""
	}
	return "Cumulative shares of the profile: " + strings.Join(notes, "; ") + "."
}
