package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// TestWriterTakesOnlyTransactions: a handle that is not a transaction (a
// pool, a connection, database/sql's DB or Conn) cannot be handed to Write
// or WriteSQL, because each would autocommit the event on its own: a phantom
// when the business transaction rolls back. Each handle the writer's
// signature would still take is called the way a mistaken caller would (the
// business change in a transaction that rolls back, the event through the
// handle) and the phantom is counted. Transactions of every kind commit with
// the business change and leave nothing when it rolls back.
func TestWriterTakesOnlyTransactions(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db, err := sql.Open("pgx", pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows := func(aggID string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregateid = $1`, aggID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	w, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	write := reflect.ValueOf(w.Write)
	writeSQL := reflect.ValueOf(w.WriteSQL)

	poolConn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer poolConn.Release()
	sqlConn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlConn.Close()
	for _, h := range []struct {
		name   string
		handle any
		fn     reflect.Value
	}{
		{"*pgxpool.Pool", pool, write},
		{"*pgx.Conn", pg.Conn(t, "outbox"), write},
		{"*pgxpool.Conn", poolConn, write},
		{"*sql.DB", db, writeSQL},
		{"*sql.Conn", sqlConn, writeSQL},
	} {
		param := h.fn.Type().In(1)
		if !reflect.TypeOf(h.handle).AssignableTo(param) {
			continue // refused when the caller's code is compiled
		}
		// Still accepted: show what it costs.
		aggID := "phantom-" + h.name
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, aggID); err != nil {
			t.Fatal(err)
		}
		out := h.fn.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(h.handle),
			reflect.ValueOf(outbox.Event{AggregateType: "Order", AggregateID: aggID, Type: "OrderPlaced", Payload: 1})})
		_ = tx.Rollback(ctx)
		werr, _ := out[1].Interface().(error)
		t.Errorf("%s is accepted as %s by the writer (write error %v): %d event rows after the business transaction rolled back, want 0",
			h.name, param, werr, rows(aggID))
	}

	// Every kind of transaction: a rollback leaves nothing, a commit the row.
	for _, c := range []struct {
		name  string
		begin func() (write func(outbox.Event) error, commit, rollback func() error)
	}{
		{"pgx.Tx", func() (func(outbox.Event) error, func() error, func() error) {
			tx, err := pg.Conn(t, "outbox").Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return func(ev outbox.Event) error { _, err := w.Write(ctx, tx, ev); return err },
				func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
		}},
		{"pgxpool.Tx", func() (func(outbox.Event) error, func() error, func() error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return func(ev outbox.Event) error { _, err := w.Write(ctx, tx, ev); return err },
				func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
		}},
		{"savepoint", func() (func(outbox.Event) error, func() error, func() error) {
			outer, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := outer.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return func(ev outbox.Event) error { _, err := w.Write(ctx, tx, ev); return err },
				func() error {
					if err := tx.Commit(ctx); err != nil {
						return err
					}
					return outer.Commit(ctx)
				}, func() error { return outer.Rollback(ctx) }
		}},
		{"*sql.Tx", func() (func(outbox.Event) error, func() error, func() error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return func(ev outbox.Event) error { _, err := w.WriteSQL(ctx, tx, ev); return err }, tx.Commit, tx.Rollback
		}},
	} {
		for _, end := range []string{"rollback", "commit"} {
			aggID := c.name + "-" + end
			write, commit, rollback := c.begin()
			if err := write(outbox.Event{AggregateType: "Order", AggregateID: aggID, Type: "OrderPlaced", Payload: 1}); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			want := 0
			if end == "commit" {
				want = 1
				if err := commit(); err != nil {
					t.Fatal(err)
				}
			} else if err := rollback(); err != nil {
				t.Fatal(err)
			}
			if n := rows(aggID); n != want {
				t.Errorf("%s, %s: %d rows, want %d", c.name, end, n, want)
			}
		}
	}
	// A transaction that already ended is refused by pgx, nothing written.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, outbox.Event{AggregateType: "Order", AggregateID: "after-commit", Type: "OrderPlaced"}); err == nil || rows("after-commit") != 0 {
		t.Errorf("a write after commit: err %v, %d rows; want an error and no row", err, rows("after-commit"))
	}
}

// TestWritePoolDoesNotCompile: the mistake is caught by the compiler, with a
// message that names the type to pass. The program is built with the go
// command, an overlay placing it in the module.
func TestWritePoolDoesNotCompile(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to compile the mistaken caller: %v", err)
	}
	dir := t.TempDir()
	for _, c := range []struct{ name, src, want string }{
		{"pool", `package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/outbox"
)

func main() {
	pool, _ := pgxpool.New(context.Background(), "")
	_, _ = outbox.Write(context.Background(), pool, outbox.Event{})
}
`, "*pgxpool.Pool does not implement pgx.Tx"},
		{"sqldb", `package main

import (
	"context"
	"database/sql"

	"github.com/pgoutbox/pgoutbox/outbox"
)

func main() {
	db, _ := sql.Open("pgx", "")
	_, _ = outbox.WriteSQL(context.Background(), db, outbox.Event{})
}
`, "cannot use db (variable of type *sql.DB) as *sql.Tx value"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := filepath.Join(dir, c.name+".go")
			if err := os.WriteFile(src, []byte(c.src), 0o600); err != nil {
				t.Fatal(err)
			}
			// A directory of the module that does not exist: the overlay
			// alone holds the program.
			pkgDir := filepath.Join(testenv.RepoRoot(), "outbox", "internal", "mistake"+c.name)
			overlay, _ := json.Marshal(map[string]any{"Replace": map[string]string{filepath.Join(pkgDir, "main.go"): src}})
			ovl := filepath.Join(dir, c.name+".json")
			if err := os.WriteFile(ovl, overlay, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(gobin, "build", "-overlay", ovl, "-o", os.DevNull, "./outbox/internal/mistake"+c.name)
			cmd.Dir = testenv.RepoRoot()
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("a caller passing a %s to the writer compiles; want it refused", c.name)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("compiler said:\n%s\nwant a message containing %q", out, c.want)
			}
			t.Log(strings.TrimSpace(string(out)))
		})
	}
}
