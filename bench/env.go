package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/localenv"
)

// env is what one bench run starts and must clean up: a PostgreSQL cluster
// (fsync on), a Kafka broker, and the binaries under test.
type env struct {
	log  *slog.Logger
	root string // module root
	tmp  string // scratch directory, removed at the end

	pg       *localenv.Postgres
	kafkaDir string
	brokers  string
	kafkaPid int

	connectorBin string
	pprofBin     string
	buildNote    string // how the binaries were built (overlay fallback)

	admin *kadm.Client
	kcl   *kgo.Client
}

func startEnv(ctx context.Context, log *slog.Logger, root string) (e *env, err error) {
	tmp, err := os.MkdirTemp("", "outbox-bench-")
	if err != nil {
		return nil, err
	}
	e = &env{log: log, root: root, tmp: tmp}
	defer func() {
		if err != nil {
			e.close()
			e = nil
		}
	}()
	log.Info("building the connector (no -race)")
	if err := e.build(ctx); err != nil {
		return e, err
	}
	log.Info("starting PostgreSQL (fsync on, synchronous_commit on)")
	pg, err := localenv.NewPostgres(localenv.PGOptions{Fsync: true})
	if err != nil {
		return e, fmt.Errorf("start PostgreSQL: %w", err)
	}
	e.pg = pg
	log.Info("PostgreSQL up", "version", pg.Version, "port", pg.Port)
	if err := e.startKafka(ctx); err != nil {
		return e, err
	}
	log.Info("Kafka up", "brokers", e.brokers, "pid", e.kafkaPid)
	e.kcl, err = kgo.NewClient(kgo.SeedBrokers(e.brokers))
	if err != nil {
		return e, err
	}
	e.admin = kadm.NewClient(e.kcl)
	if err := e.warmKafka(ctx); err != nil {
		return e, err
	}
	if err := e.setupSQL(ctx); err != nil {
		return e, err
	}
	return e, nil
}

// warmKafka runs one Kafka transaction, so that the broker creates its
// transaction state log now rather than during the first measured drain.
func (e *env) warmKafka(ctx context.Context) error {
	const topic = "bench.warmup"
	if err := e.createTopic(ctx, topic); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.TransactionalID("bench-warmup"), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("warm Kafka up: %w", err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("warm-up")}).FirstErr(); err != nil {
		return fmt.Errorf("warm Kafka up: %w", err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return fmt.Errorf("warm Kafka up: %w", err)
	}
	return nil
}

func (e *env) close() {
	if e.kcl != nil {
		e.kcl.Close()
	}
	if e.kafkaDir != "" {
		_ = exec.Command(filepath.Join(e.root, "scripts", "kafka.sh"), "stop", e.kafkaDir).Run()
	}
	if e.pg != nil {
		e.pg.Destroy()
	}
	if e.tmp != "" {
		_ = os.RemoveAll(e.tmp)
	}
}

func (e *env) startKafka(ctx context.Context) error {
	e.kafkaDir = filepath.Join(e.tmp, "kafka")
	if err := os.MkdirAll(e.kafkaDir, 0o755); err != nil {
		return err
	}
	e.log.Info("starting Apache Kafka (scripts/kafka.sh; the first run resolves its jars from Maven Central)")
	cmd := exec.CommandContext(ctx, filepath.Join(e.root, "scripts", "kafka.sh"), "start", e.kafkaDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("scripts/kafka.sh start: %w: %s", err, tailString(stderr.String(), 2000))
	}
	e.brokers = strings.TrimSpace(string(out))
	pid, _ := os.ReadFile(filepath.Join(e.kafkaDir, "pid"))
	e.kafkaPid, _ = strconv.Atoi(strings.TrimSpace(string(pid)))
	return localenv.WaitKafka(ctx, e.brokers, 60*time.Second)
}

// benchPayloadSQL defines the event payload every system carries: an order
// of about 300 bytes of JSON, with the writer's clock (bench_t, Unix ns) read
// just before COMMIT was sent, for latency.
const benchPayloadSQL = `
CREATE OR REPLACE FUNCTION bench_payload(seq bigint, t bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
SELECT jsonb_build_object(
  'bench_t', t,
  'orderId', seq,
  'customerId', 'customer-' || (seq % 9973),
  'currency', 'EUR',
  'total', ((seq % 50000) / 100.0)::text,
  'status', 'CREATED',
  'items', jsonb_build_array(
     jsonb_build_object('sku', 'SKU-' || (seq % 1000), 'qty', 1 + seq % 3, 'price', '19.95'),
     jsonb_build_object('sku', 'SKU-' || (seq % 777), 'qty', 2, 'price', '5.50')),
  'shipping', jsonb_build_object('street', 'Hauptstrasse ' || (seq % 200), 'city', 'Berlin', 'zip', '10115', 'country', 'DE'))
$$;`

func (e *env) setupSQL(ctx context.Context) error {
	conn, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, benchPayloadSQL); err != nil {
		return fmt.Errorf("create bench_payload: %w", err)
	}
	return nil
}

func (e *env) dsn() string { return e.pg.DSN("outbox") }

func (e *env) connect(ctx context.Context) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, e.dsn())
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return c, nil
}

// build compiles the connector and the profiling harness, each from the
// working tree when it compiles. Other engineers edit the module while the
// bench runs: when a binary does not compile as the tree is, it is built
// from the last commit instead, through go build -overlay (every Go file that
// differs from HEAD is replaced by its committed version, every uncommitted
// one hidden); nothing in the repository is changed.
func (e *env) build(ctx context.Context) error {
	e.connectorBin = filepath.Join(e.tmp, "bin", "connector")
	e.pprofBin = filepath.Join(e.tmp, "bin", "connector-pprof")
	var overlay string
	for _, b := range []struct{ out, pkg string }{{e.connectorBin, "./connector"}, {e.pprofBin, "./bench/pprofrelay"}} {
		first := e.goBuild(ctx, b.out, b.pkg, "")
		if first == nil {
			continue
		}
		e.log.Warn("does not build from the working tree; building it from HEAD (go build -overlay)", "pkg", b.pkg, "err", first)
		if overlay == "" {
			var err error
			if overlay, err = e.headOverlay(ctx); err != nil {
				return fmt.Errorf("build: %w; and the HEAD overlay failed: %w", first, err)
			}
		}
		if err := e.goBuild(ctx, b.out, b.pkg, overlay); err != nil {
			return fmt.Errorf("build: %w; from HEAD: %w", first, err)
		}
		e.buildNote += fmt.Sprintf("%s did not compile in the working tree (another change in progress); it was built from the last commit (go build -overlay). ", b.pkg)
	}
	e.buildNote = strings.TrimSpace(e.buildNote)
	return nil
}

func (e *env) goBuild(ctx context.Context, out, pkg, overlay string) error {
	args := []string{"build", "-o", out}
	if overlay != "" {
		args = append(args, "-overlay", overlay)
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = e.root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, tailString(string(b), 1500))
	}
	return nil
}

// treeDiff compares the working tree with HEAD for files that match keep:
// those whose content differs (or that are gone) and those not committed.
// It uses read-only git plumbing (ls-tree, hash-object without -w).
func (e *env) treeDiff(ctx context.Context, keep func(string) bool) (head string, changed, uncommitted []string, blobs map[string]string, err error) {
	git := func(args ...string) ([]byte, error) {
		return exec.CommandContext(ctx, "git", append([]string{"-C", e.root}, args...)...).Output()
	}
	rev, err := git("rev-parse", "--short", "HEAD")
	if err != nil {
		return "", nil, nil, nil, fmt.Errorf("git rev-parse: %w", err)
	}
	head = strings.TrimSpace(string(rev))
	tree, err := git("ls-tree", "-r", "HEAD")
	if err != nil {
		return "", nil, nil, nil, fmt.Errorf("git ls-tree: %w", err)
	}
	blobs = map[string]string{} // committed path -> blob
	for _, line := range strings.Split(string(tree), "\n") {
		meta, path, ok := strings.Cut(line, "\t")
		if f := strings.Fields(meta); ok && len(f) == 3 && f[1] == "blob" && keep(path) {
			blobs[path] = f[2]
		}
	}
	var present []string
	err = filepath.WalkDir(e.root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(e.root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && rel != "." {
			return filepath.SkipDir
		}
		if !d.IsDir() && keep(rel) {
			present = append(present, rel)
		}
		return nil
	})
	if err != nil {
		return "", nil, nil, nil, err
	}
	hashes := map[string]string{}
	if len(present) > 0 {
		out, err := git(append([]string{"hash-object", "--"}, present...)...)
		if err != nil {
			return "", nil, nil, nil, fmt.Errorf("git hash-object: %w", err)
		}
		for i, h := range strings.Fields(string(out)) {
			if i < len(present) {
				hashes[present[i]] = h
			}
		}
	}
	for path, blob := range blobs {
		if hashes[path] != blob {
			changed = append(changed, path)
		}
	}
	for _, path := range present {
		if _, ok := blobs[path]; !ok {
			uncommitted = append(uncommitted, path)
		}
	}
	sort.Strings(changed)
	sort.Strings(uncommitted)
	return head, changed, uncommitted, blobs, nil
}

// isModuleGo matches the Go files the binaries are built from.
func isModuleGo(f string) bool {
	return strings.HasSuffix(f, ".go") && !strings.HasSuffix(f, "_test.go") && !strings.HasPrefix(f, "bench/")
}

// headOverlay writes a go build overlay that makes the module's Go files
// (outside bench/) what they are at HEAD.
func (e *env) headOverlay(ctx context.Context) (string, error) {
	_, changed, uncommitted, _, err := e.treeDiff(ctx, isModuleGo)
	if err != nil {
		return "", err
	}
	copies := filepath.Join(e.tmp, "head")
	replace := map[string]string{}
	for _, path := range changed {
		body, err := exec.CommandContext(ctx, "git", "-C", e.root, "show", "HEAD:"+path).Output()
		if err != nil {
			return "", fmt.Errorf("git show HEAD:%s: %w", path, err)
		}
		dst := filepath.Join(copies, filepath.FromSlash(path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(dst, body, 0o644); err != nil {
			return "", err
		}
		replace[filepath.Join(e.root, filepath.FromSlash(path))] = dst
	}
	for _, path := range uncommitted {
		replace[filepath.Join(e.root, filepath.FromSlash(path))] = ""
	}
	body, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return "", err
	}
	p := filepath.Join(e.tmp, "overlay.json")
	return p, os.WriteFile(p, body, 0o644)
}

// source says what the connector was built from, for the report.
func (e *env) source(ctx context.Context) string {
	relevant := func(f string) bool {
		return isModuleGo(f) && (strings.HasPrefix(f, "connector/") || strings.HasPrefix(f, "outbox-router/") || strings.HasPrefix(f, "relay/") || strings.HasPrefix(f, "route/") || strings.HasPrefix(f, "internal/")) ||
			strings.HasPrefix(f, "sql/") && strings.HasSuffix(f, ".sql") || f == "go.mod"
	}
	head, changed, uncommitted, _, err := e.treeDiff(ctx, relevant)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	if e.buildNote != "" {
		return fmt.Sprintf("commit %s (the working tree did not compile; see the note)", head)
	}
	if len(changed)+len(uncommitted) == 0 {
		return fmt.Sprintf("commit %s, no uncommitted changes in connector/, outbox-router/, relay/, route/, internal/, sql/", head)
	}
	return fmt.Sprintf("the working tree at commit %s with uncommitted changes (other work in progress) in %d files: %s",
		head, len(changed)+len(uncommitted), strings.Join(append(changed, uncommitted...), ", "))
}

// createSlot creates a pgoutput slot: what the connector adopts, and what
// pg_recvlogical and Debezium read.
func (e *env) createSlot(ctx context.Context, conn *pgx.Conn, name string) error {
	_, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name)
	if err != nil {
		return fmt.Errorf("create slot %s: %w", name, err)
	}
	return nil
}

func (e *env) dropSlot(ctx context.Context, name string) {
	conn, err := e.connect(ctx)
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	// The walsender of a stopped client may take a moment to exit.
	for i := 0; i < 50; i++ {
		_, err = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", name)
		var exists bool
		if err == nil && conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", name).Scan(&exists) == nil && !exists {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createTopic creates topic with the bench's partition count; LogAppendTime
// makes each record's timestamp the broker's append time, the moment the
// acknowledgement is due (acks=all on one broker), for commit-to-ack latency.
func (e *env) createTopic(ctx context.Context, topic string) error {
	v := "LogAppendTime"
	resp, err := e.admin.CreateTopic(ctx, topicPartitions, 1, map[string]*string{"message.timestamp.type": &v}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !strings.Contains(err.Error(), "TOPIC_ALREADY_EXISTS") {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// topicPartitions matches the connector's default OUTBOX_TOPIC_PARTITIONS.
const topicPartitions = 6

// endOffsets sums the topic's partition end offsets: records in Kafka.
func (e *env) endOffsets(ctx context.Context, topic string) (int64, error) {
	offs, err := e.admin.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	var errs []error
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			errs = append(errs, o.Err)
			return
		}
		n += o.Offset
	})
	return n, errors.Join(errs...)
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
