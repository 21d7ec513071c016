package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// The HA tests run two or three connector processes against one
// PostgreSQL cluster and the shared Kafka broker, with a short lease TTL. The
// server keeps its default wal_sender_timeout (60 s): a frozen or killed
// leader's walsender must be dealt with by the connector, not by the
// server's timeout. A monitor scrapes every instance's /metrics throughout
// and fails the test if two instances ever report outbox_connector_leader 1
// in the same round.

const haTTL = 2 * time.Second

// haNode is one connector process.
type haNode struct {
	name string
	addr string
	proc *testenv.Proc
}

// haCluster is the instances of one test, the load and the monitor.
type haCluster struct {
	t       *testing.T
	pg      *testenv.Postgres
	brokers string
	bin     string
	aggType string
	env     map[string]string

	mu      sync.Mutex
	nodes   []*haNode // running
	started []*haNode
	seq     int

	mon *leaderMonitor
}

func newHACluster(t *testing.T, extraEnv ...string) *haCluster {
	t.Helper()
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	c := &haCluster{t: t, pg: pg, brokers: brokers, bin: testenv.Binary(t, "connector"),
		aggType: fmt.Sprintf("ha%d", time.Now().UnixNano()%1e9)}
	c.env = connectorEnv(pg, brokers, append([]string{"OUTBOX_LEASE_TTL", haTTL.String()}, extraEnv...)...)
	c.mon = startLeaderMonitor(t, c)
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("OUTBOX_HA_LOGS") != "" {
			for _, n := range c.every() {
				t.Logf("output of %s:\n%s", n.name, tail(n.proc.Output()))
			}
		}
	})
	return c
}

// start starts one more instance.
func (c *haCluster) start() *haNode {
	c.t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.seq++
	n := &haNode{name: fmt.Sprintf("node%d", c.seq), addr: fmt.Sprintf("127.0.0.1:%d", port)}
	c.mu.Unlock()
	env := map[string]string{"OUTBOX_HTTP_ADDR": n.addr}
	for k, v := range c.env {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
	n.proc = testenv.StartProc(c.t, c.bin, env)
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.started = append(c.started, n)
	c.mu.Unlock()
	return n
}

// every is every instance started, exited ones too.
func (c *haCluster) every() []*haNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*haNode(nil), c.started...)
}

func (c *haCluster) all() []*haNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*haNode(nil), c.nodes...)
}

// remove forgets a node that exited (the monitor stops scraping it).
func (c *haCluster) remove(n *haNode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.nodes {
		if x == n {
			c.nodes = append(c.nodes[:i], c.nodes[i+1:]...)
			return
		}
	}
}

// sample is one scrape of one instance.
type sample struct {
	ok     bool
	leader bool
	token  int64
	at     time.Time
}

// leaderMonitor scrapes every instance every 50 ms, concurrently.
type leaderMonitor struct {
	mu         sync.Mutex
	last       map[*haNode]sample
	busy       map[*haNode]bool
	rounds     int
	empty      int // rounds with no leader among the instances that answered
	violations []string
	stop       chan struct{}
	done       chan struct{}
}

func startLeaderMonitor(t *testing.T, c *haCluster) *leaderMonitor {
	m := &leaderMonitor{last: map[*haNode]sample{}, busy: map[*haNode]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 300 * time.Millisecond}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-tick.C:
			}
			// One round scrapes every instance at once and keeps what
			// answers within 150 ms: a frozen instance does not slow the
			// others' sampling, and is not scraped again while a request
			// to it is pending.
			nodes := c.all()
			type result struct {
				n *haNode
				s sample
			}
			results := make(chan result, len(nodes))
			launched := 0
			for _, n := range nodes {
				m.mu.Lock()
				busy := m.busy[n]
				m.busy[n] = true
				m.mu.Unlock()
				if busy {
					continue
				}
				launched++
				go func() {
					s := scrapeLeader(client, n.addr)
					m.mu.Lock()
					m.busy[n] = false
					m.mu.Unlock()
					results <- result{n, s}
				}()
			}
			var got []result
			timer := time.NewTimer(150 * time.Millisecond)
		collect:
			for len(got) < launched {
				select {
				case r := <-results:
					got = append(got, r)
				case <-timer.C:
					break collect
				}
			}
			timer.Stop()
			m.mu.Lock()
			m.rounds++
			var leaders []string
			for _, r := range got {
				if r.s.ok {
					m.last[r.n] = r.s
					if r.s.leader {
						leaders = append(leaders, fmt.Sprintf("%s(token %d)", r.n.name, r.s.token))
					}
				}
			}
			if len(leaders) > 1 {
				m.violations = append(m.violations, fmt.Sprintf("%s: %d instances report outbox_connector_leader 1: %s",
					time.Now().Format("15:04:05.000"), len(leaders), strings.Join(leaders, ", ")))
			}
			if len(leaders) == 0 {
				m.empty++
			}
			m.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		close(m.stop)
		<-m.done
		m.mu.Lock()
		defer m.mu.Unlock()
		t.Logf("leader monitor: %d scrape rounds, %d without a leader (takeovers), %d with more than one", m.rounds, m.empty, len(m.violations))
		for _, v := range m.violations {
			t.Errorf("more than one leader at once: %s", v)
		}
	})
	return m
}

// scrapeLeader reads outbox_connector_leader and the lease token from addr.
func scrapeLeader(client *http.Client, addr string) sample {
	s := sample{at: time.Now()}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return s
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var seenLeader bool
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "outbox_connector_leader "):
			seenLeader = true
			s.leader = strings.TrimSpace(strings.TrimPrefix(line, "outbox_connector_leader ")) == "1"
		case strings.HasPrefix(line, "outbox_connector_lease_token "):
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, "outbox_connector_lease_token ")), 64)
			s.token = int64(v)
		}
	}
	s.ok = sc.Err() == nil && seenLeader
	return s
}

// leader waits until exactly one instance reports itself leader with a token
// above after, and returns it with its token and when it was first seen.
func (c *haCluster) leader(after int64, timeout time.Duration) (*haNode, int64, time.Time) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.mon.mu.Lock()
		var found *haNode
		var s sample
		n := 0
		for _, node := range c.all() {
			if x, ok := c.mon.last[node]; ok && x.leader && x.token > after && !node.proc.Exited() {
				found, s = node, x
				n++
			}
		}
		c.mon.mu.Unlock()
		if n == 1 {
			return found, s.token, s.at
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no single instance became leader with a token above %d within %s", after, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// standby waits until n answers scrapes as a standby.
func (c *haCluster) standby(n *haNode, since time.Time, timeout time.Duration) time.Time {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.mon.mu.Lock()
		s, ok := c.mon.last[n]
		c.mon.mu.Unlock()
		if ok && s.at.After(since) && !s.leader {
			return s.at
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s did not report standby within %s; output:\n%s", n.name, timeout, tail(n.proc.Output()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ready checks /readyz on every running instance: leaders and standbys alike.
func (c *haCluster) ready() {
	c.t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	for _, n := range c.all() {
		resp, err := client.Get("http://" + n.addr + "/readyz")
		if err != nil {
			c.t.Errorf("%s /readyz: %v", n.name, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			c.t.Errorf("%s /readyz: %s", n.name, resp.Status)
		}
		resp, err = client.Get("http://" + n.addr + "/leader")
		if err != nil {
			c.t.Errorf("%s /leader: %v", n.name, err)
			continue
		}
		resp.Body.Close()
		c.mon.mu.Lock()
		s := c.mon.last[n]
		c.mon.mu.Unlock()
		if (resp.StatusCode == http.StatusOK) != s.leader {
			c.t.Errorf("%s: /leader answered %s but outbox_connector_leader is %v", n.name, resp.Status, s.leader)
		}
	}
}

// settle waits until one instance leads and every other one reports standby.
func (c *haCluster) settle(after int64) (*haNode, int64) {
	c.t.Helper()
	n, tok, _ := c.leader(after, 60*time.Second)
	now := time.Now()
	for _, x := range c.all() {
		if x != n {
			c.standby(x, now, 30*time.Second)
		}
	}
	return n, tok
}

// checkTokenOrder fails the test if, in any partition, a record carries an
// older lease token than a record before it: a deposed leader published
// after its successor had started.
func checkTokenOrder(t *testing.T, recs []*kgo.Record) map[int64]int {
	t.Helper()
	perToken := map[int64]int{}
	last := map[string]int64{}
	bad := 0
	for _, r := range recs {
		tok, err := strconv.ParseInt(testenv.Header(r, "outbox.lease.token"), 10, 64)
		if err != nil {
			t.Errorf("record at %s/%d offset %d: header outbox.lease.token %q is not a decimal token", r.Topic, r.Partition, r.Offset, testenv.Header(r, "outbox.lease.token"))
			continue
		}
		perToken[tok]++
		key := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
		if tok < last[key] {
			bad++
			if bad <= 10 {
				t.Errorf("partition %s offset %d: token %d after a record with token %d", key, r.Offset, tok, last[key])
			}
		}
		if tok > last[key] {
			last[key] = tok
		}
	}
	return perToken
}

// consumeAll reads every record of topic from the start with the given
// isolation level: at least atLeast records, then until the topic stays
// quiet for two seconds.
func consumeAll(t *testing.T, brokers, topic string, committed bool, atLeast int) []*kgo.Record {
	t.Helper()
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(iso))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	idle := 0
	for ctx.Err() == nil && (len(recs) < max(atLeast, 1) || idle < 2) {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		pcancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r); n++ })
		if n == 0 {
			idle++
		} else {
			idle = 0
		}
	}
	if len(recs) < atLeast {
		t.Errorf("read %d records from %s (committed=%v); want at least %d", len(recs), topic, committed, atLeast)
	}
	return recs
}

// durations summarises takeover times.
type durations []time.Duration

func (d durations) String() string {
	if len(d) == 0 {
		return "none"
	}
	s := append(durations(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("n=%d median %s worst %s best %s", len(s), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), s[0].Round(time.Millisecond))
}

// faultKill kills the leader with SIGKILL and returns how long until
// another instance led.
func faultKill(c *haCluster, old *haNode, oldTok int64) (time.Duration, *haNode, int64) {
	c.t.Helper()
	at := time.Now()
	old.proc.Signal(syscall.SIGKILL)
	old.proc.Wait(c.t, 10*time.Second)
	c.remove(old)
	n, tok, seen := c.leader(oldTok, 15*time.Second)
	return seen.Sub(at), n, tok
}

// faultFreeze stops the leader with SIGSTOP until a standby led and a
// second more (longer than the TTL), then resumes it: it must step down and
// report standby. It returns the takeover time.
func faultFreeze(c *haCluster, old *haNode, oldTok int64) (time.Duration, *haNode, int64) {
	c.t.Helper()
	at := time.Now()
	old.proc.Signal(syscall.SIGSTOP)
	n, tok, seen := c.leader(oldTok, haTTL+15*time.Second)
	time.Sleep(time.Second)
	if frozenFor := time.Since(at); frozenFor < haTTL {
		c.t.Fatalf("frozen for only %s, less than the TTL", frozenFor)
	}
	resumed := time.Now()
	old.proc.Signal(syscall.SIGCONT)
	back := c.standby(old, resumed, 10*time.Second)
	c.t.Logf("%s resumed after %s frozen, reported standby %s later", old.name, resumed.Sub(at).Round(time.Millisecond), back.Sub(resumed).Round(time.Millisecond))
	return seen.Sub(at), n, tok
}

// faultTerm sends SIGTERM to the leader: it stops gracefully, releases the
// lease and exits 0, and a standby takes over at once.
func faultTerm(c *haCluster, old *haNode, oldTok int64) (time.Duration, *haNode, int64) {
	c.t.Helper()
	at := time.Now()
	old.proc.Signal(syscall.SIGTERM)
	n, tok, seen := c.leader(oldTok, 15*time.Second)
	if code := old.proc.Wait(c.t, 60*time.Second); code != 0 {
		c.t.Errorf("%s: exit code %d after SIGTERM", old.name, code)
	}
	if out := old.proc.Output(); !strings.Contains(out, "final position confirmed") || !strings.Contains(out, "released the leader lease") {
		c.t.Errorf("%s did not confirm its final position and release the lease:\n%s", old.name, tail(out))
	}
	c.remove(old)
	return seen.Sub(at), n, tok
}

// faultCut ends the leader's lease session and walsender from the server
// side, as a cut connection would, leaving the process alive: it must step
// down within the TTL, and a standby take over.
func faultCut(c *haCluster, old *haNode, oldTok int64) (time.Duration, *haNode, int64) {
	c.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.pg.DSN("outbox"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close(ctx)
	at := time.Now()
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT pg_terminate_backend(pid) FROM (
			SELECT holder_pid AS pid FROM outbox_lease WHERE slot_name = 'outbox_slot'
			UNION SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outbox_slot') p WHERE pid IS NOT NULL) t`).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	if n != 2 {
		c.t.Errorf("terminated %d sessions of the leader; want its lease session and its walsender", n)
	}
	down := c.standby(old, at, haTTL)
	nn, tok, seen := c.leader(oldTok, 15*time.Second)
	c.t.Logf("%s reported standby %s after the cut", old.name, down.Sub(at).Round(time.Millisecond))
	if nn == old {
		c.t.Errorf("the leader whose connection was cut took the lease back; want a standby")
	}
	return seen.Sub(at), nn, tok
}

type faultFunc func(c *haCluster, old *haNode, oldTok int64) (time.Duration, *haNode, int64)

// runHA starts instances instances under load, injects fault rounds times
// (restoring the instance count after each), checks that nothing was lost
// and first deliveries per aggregate stayed in order, that no deposed
// leader published after its successor, and returns the takeover times and
// the duplicate count.
func runHA(t *testing.T, instances, rounds int, fault faultFunc, extraEnv ...string) (durations, int) {
	c := newHACluster(t, extraEnv...)
	cons := testenv.StartConsumer(t, c.brokers, "outbox.event."+c.aggType)
	for i := 0; i < instances; i++ {
		c.start()
	}
	leader, tok := c.settle(0)
	c.ready()
	bw := testenv.StartLoad(t, c.pg.DSN("outbox"), c.aggType, 100, 3*time.Millisecond)
	var took durations
	for i := 0; i < rounds; i++ {
		time.Sleep(time.Second)
		d, nl, nt := fault(c, leader, tok)
		t.Logf("round %d: %s (token %d) -> %s (token %d) in %s", i+1, leader.name, tok, nl.name, nt, d.Round(time.Millisecond))
		took = append(took, d)
		leader, tok = nl, nt
		for len(c.all()) < instances {
			c.start()
		}
		leader, tok = c.settle(tok - 1)
		c.ready()
	}
	time.Sleep(time.Second)
	want := bw.Halt()
	cons.WaitFor(t, want, 2*time.Minute)
	dups := cons.Verify(t, want)
	committed := consumeAll(t, c.brokers, "outbox.event."+c.aggType, true, len(want)+dups)
	perToken := checkTokenOrder(t, committed)
	if perToken[tok] == 0 {
		t.Errorf("the last leader (token %d) published nothing", tok)
	}
	uncommitted := consumeAll(t, c.brokers, "outbox.event."+c.aggType, false, len(committed))
	t.Logf("%d events written (%d writer errors); all delivered, first deliveries in order; %d duplicates; records per token (read_committed): %v; %d records read_uncommitted",
		len(want), bw.Errors(), dups, perToken, len(uncommitted))
	checkTokenOrder(t, uncommitted)
	return took, dups
}

// TestHAKill9UnderLoad: three instances under load; the leader is killed
// with SIGKILL twice in a row: each time a standby streams again within
// 15 s (goal: 3 s), nothing is lost and first deliveries per aggregate stay
// in commit order.
func TestHAKill9UnderLoad(t *testing.T) {
	took, dups := runHA(t, 3, 2, faultKill)
	t.Logf("kill -9 takeovers: %s; %d duplicates", took, dups)
	if dups != 0 {
		t.Errorf("%d duplicates across kill -9 takeovers in exactly-once mode; want 0", dups)
	}
	for _, d := range took {
		if d > 3*time.Second {
			t.Logf("takeover took %s, above the 3 s goal", d)
		}
	}
}

// TestHAFrozenLeader: the leader frozen with SIGSTOP for longer than the
// TTL: a standby takes over (goal: within TTL + 2 s); resumed, the old
// leader publishes nothing after the new leader's first record (per
// partition, token order holds, read committed and uncommitted), steps down
// and reports standby.
func TestHAFrozenLeader(t *testing.T) {
	took, dups := runHA(t, 3, 1, faultFreeze)
	t.Logf("SIGSTOP takeovers: %s (TTL %s); %d duplicates", took, haTTL, dups)
	if dups != 0 {
		t.Errorf("%d duplicates across a frozen leader's takeover in exactly-once mode; want 0", dups)
	}
	for _, d := range took {
		if d > haTTL+15*time.Second {
			t.Errorf("takeover took %s after the freeze; want within TTL + 15 s", d)
		}
	}
}

// TestHASIGTERMHandover: SIGTERM on the leader: it stops reading, flushes
// Kafka, confirms its last position and releases the lease; the standby
// streams within 15 s (goal: 1 s), and no event is delivered twice.
func TestHASIGTERMHandover(t *testing.T) {
	took, dups := runHA(t, 2, 2, faultTerm)
	t.Logf("SIGTERM handovers: %s; %d duplicates", took, dups)
	if dups != 0 {
		t.Errorf("%d duplicates across graceful handovers; want 0", dups)
	}
}

// TestHAConnectionCut: the leader's lease session and walsender are ended
// by the server (its connection cut, the process alive): it steps down
// within the TTL and a standby takes over.
func TestHAConnectionCut(t *testing.T) {
	took, dups := runHA(t, 2, 1, faultCut)
	t.Logf("connection-cut takeovers: %s; %d duplicates", took, dups)
	if dups != 0 {
		t.Errorf("%d duplicates across a cut leader's takeover in exactly-once mode; want 0", dups)
	}
}

// TestHASoak measures takeover times over 10 runs of each case (make soak,
// OUTBOX_SOAK=1; never in CI by default).
func TestHASoak(t *testing.T) {
	if os.Getenv("OUTBOX_SOAK") != "1" {
		t.Skip("set OUTBOX_SOAK=1 (make soak) to measure takeover times over many runs")
	}
	runs := 10
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_SOAK_RUNS")); err == nil && v > 0 {
		runs = v
	}
	cases := []struct {
		name      string
		instances int
		fault     faultFunc
	}{
		{"kill9", 2, faultKill},
		{"sigstop", 2, faultFreeze},
		{"sigterm", 2, faultTerm},
		{"cut", 2, faultCut},
	}
	results := map[string]durations{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			took, dups := runHA(t, tc.instances, runs, tc.fault)
			results[tc.name] = took
			t.Logf("%s: takeover %s; %d duplicates", tc.name, took, dups)
		})
	}
	for _, tc := range cases {
		t.Logf("soak %-8s takeover %s (TTL %s)", tc.name, results[tc.name], haTTL)
	}
}
