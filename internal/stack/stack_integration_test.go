package stack

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestUpDown runs `make up` as a user on a fresh machine would (as root
// here, in a HOME of its own), runs the connector against the stack it
// prints until an event written to the outbox is in Kafka, then `make down`:
// nothing of the stack is left running, down says what it stopped, a second
// down says nothing was running, and no output shows a NOTICE or a terminal
// colour code.
func TestUpDown(t *testing.T) {
	root := testenv.RepoRoot()
	// The state directory: the default is per user under /var/tmp; a test
	// must not touch a stack someone started by hand.
	state, err := os.MkdirTemp("", "outbox-stack-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cache := os.Getenv("OUTBOX_CACHE_DIR")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "pgoutbox") // the jars install.sh resolved: not downloaded again
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"OUTBOX_STACK_DIR=" + state, "OUTBOX_STACK_PG_PORT=" + strconv.Itoa(port), "OUTBOX_CACHE_DIR=" + cache,
	}
	make := func(target string) (stdout, stderr string) {
		t.Helper()
		cmd := exec.Command("make", "-s", "-C", root, target)
		cmd.Env = env
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		start := time.Now()
		err := cmd.Run()
		t.Logf("make %s: %s\nstdout:\n%sstderr:\n%s", target, time.Since(start).Round(time.Millisecond), o.String(), e.String())
		if err != nil {
			t.Fatalf("make %s: %v", target, err)
		}
		for _, bad := range []string{"NOTICE", "\x1b"} {
			if strings.Contains(o.String()+e.String(), bad) {
				t.Errorf("make %s prints %q", target, bad)
			}
		}
		return o.String(), e.String()
	}
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(root, "scripts", "stack.sh"), "down")
		cmd.Env = env
		_ = cmd.Run()
	})

	out, _ := make("up")
	exports := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^export (\w+)='([^']*)'$`).FindAllStringSubmatch(out, -1) {
		exports[m[1]] = m[2]
	}
	dsn, brokers := exports["OUTBOX_PG_DSN"], exports["OUTBOX_KAFKA_BROKERS"]
	if dsn == "" || brokers == "" || exports["SLOTWATCH_PG_DSN"] == "" {
		t.Fatalf("make up printed no OUTBOX_PG_DSN, SLOTWATCH_PG_DSN and OUTBOX_KAFKA_BROKERS to export:\n%s", out)
	}
	if running(t, state) == 0 {
		t.Fatalf("make up succeeded but no process runs from %s", state)
	}

	// A second up finds the stack running and prints the same environment.
	again, _ := make("up")
	if again != out {
		t.Errorf("a second make up printed\n%s\nwant the same as the first:\n%s", again, out)
	}

	aggType := fmt.Sprintf("stack%d", time.Now().UnixNano()%1e9)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	p := testenv.StartProc(t, testenv.Binary(t, "connector"), map[string]string{
		"OUTBOX_PG_DSN": dsn, "OUTBOX_KAFKA_BROKERS": brokers, "OUTBOX_HTTP_ADDR": "off",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	ev := testenv.Event{ID: uuid.NewString(), AggType: aggType, AggID: "a1", Type: "Tested", Payload: `{"n": 1}`}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`,
		ev.ID, ev.AggType, ev.AggID, ev.Type, ev.Payload); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	c.WaitFor(t, []testenv.Event{ev}, 60*time.Second)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("connector: exit %d:\n%s", code, p.Output())
	}

	_, said := make("down")
	if !strings.Contains(said, "stopped Kafka and PostgreSQL") {
		t.Errorf("make down said %q; want it to name Kafka and PostgreSQL as stopped", said)
	}
	if n := running(t, state); n != 0 {
		t.Errorf("%d processes still run from %s after make down", n, state)
	}
	_, said = make("down")
	if !strings.Contains(said, "nothing was running") {
		t.Errorf("a second make down said %q; want \"nothing was running\"", said)
	}
}

// running counts the processes whose command line names dir (the broker's
// properties, the postmaster's data directory).
func running(t testing.TB, dir string) int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(dir)) {
			n++
		}
	}
	return n
}

// TestForeignStateDir: a state directory the script did not make (a
// mistaken OUTBOX_STACK_DIR such as /var/tmp or $HOME, or one another user
// prepared) is refused by up, down and reset, and left as it was.
func TestForeignStateDir(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	foreign := t.TempDir()
	keep := filepath.Join(foreign, "precious")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(foreign, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"down", "reset"} {
		c := exec.Command(filepath.Join(root, "scripts", "stack.sh"), cmd)
		c.Env = append(os.Environ(), "OUTBOX_STACK_DIR="+foreign)
		out, err := c.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "is not a stack directory") {
			t.Errorf("stack.sh %s on a foreign directory: %v, %s; want a refusal", cmd, err, out)
		}
	}
	fi, err := os.Stat(foreign)
	if err != nil || fi.Mode()&os.ModePerm != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("the foreign directory changed: %v, %v", fi.Mode(), err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a file in the foreign directory is gone: %v", err)
	}
}
