package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// TestMain gives the examples a database: a throwaway cluster with sql/
// applied, named by DATABASE_URL as a service would be configured.
func TestMain(m *testing.M) {
	if os.Getenv("DATABASE_URL") == "" {
		pg, err := testenv.NewPostgres(testenv.PGOptions{})
		if err != nil {
			if os.Getenv("CI") == "true" {
				fmt.Fprintln(os.Stderr, "start PostgreSQL for the examples:", err)
				os.Exit(1)
			}
			fmt.Fprintln(os.Stderr, "skipping package outbox tests: no PostgreSQL:", err)
			os.Exit(0)
		}
		os.Setenv("DATABASE_URL", pg.DSN("outbox"))
		conn, err := pgx.Connect(context.Background(), pg.DSN("outbox"))
		if err == nil {
			_, err = conn.Exec(context.Background(), `CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint NOT NULL)`)
			conn.Close(context.Background())
		}
		if err != nil {
			pg.Destroy()
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		code := m.Run()
		pg.Destroy()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

type OrderPlaced struct {
	OrderID    string `json:"order_id"`
	TotalCents int64  `json:"total_cents"`
}

// The order row and its event commit together, or neither does.
func ExampleWrite() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)

	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-1", 1299); err != nil {
			return err
		}
		_, err := outbox.Write(ctx, tx, outbox.Event{
			AggregateType: "Order", // topic outbox.event.Order
			AggregateID:   "o-1",   // record key
			Type:          "OrderPlaced",
			Payload:       OrderPlaced{OrderID: "o-1", TotalCents: 1299},
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	var payload string
	_ = conn.QueryRow(ctx, `SELECT payload::text FROM outbox WHERE aggregateid = 'o-1'`).Scan(&payload)
	fmt.Println(payload)
	// Output: {"order_id": "o-1", "total_cents": 1299}
}

// Delete-after-insert: the WAL carries the events, the table stays empty.
// Several events in one call are one statement.
func ExampleWriter_Write() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	w, err := outbox.New(outbox.Config{Mode: outbox.ModeDeleteAfterInsert})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ids, err := w.Write(ctx, tx,
		outbox.Event{AggregateType: "Order", AggregateID: "o-2", Type: "OrderPlaced", Payload: OrderPlaced{"o-2", 500}},
		outbox.Event{AggregateType: "Order", AggregateID: "o-2", Type: "OrderPaid", Payload: map[string]any{"order_id": "o-2"}},
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	var left int
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregateid = 'o-2'`).Scan(&left)
	fmt.Println(len(ids), "events written; UUIDv7:", ids[0].Version() == 7, "; rows left:", left)
	// Output: 2 events written; UUIDv7: true ; rows left: 0
}

// database/sql, here with pgx's driver ("pgx", from
// github.com/jackc/pgx/v5/stdlib); table-less mode.
func ExampleWriter_WriteSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	w, _ := outbox.New(outbox.Config{Mode: outbox.ModeMessage})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-3", 700); err != nil {
		log.Fatal(err)
	}
	if _, err := w.WriteSQL(ctx, tx, outbox.Event{AggregateType: "Order", AggregateID: "o-3", Type: "OrderPlaced",
		Payload: OrderPlaced{"o-3", 700}}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed; the event is a logical decoding message, not a row")
	// Output: committed; the event is a logical decoding message, not a row
}

// Cleanup of a table-mode outbox: run it periodically (or use the
// `maintain` command with MAINTAIN_MODE=delete).
func ExampleCleaner_DeleteExpired() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	_ = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "Order", AggregateID: "o-old", Type: "OrderPlaced",
			Payload: 1, Columns: map[string]any{"created_at": time.Now().Add(-48 * time.Hour)}})
		return err
	})
	// The cleaner takes the connection itself (or a pool): each batch is
	// its own transaction.
	n, err := outbox.Cleaner{Retention: 24 * time.Hour, BatchSize: 500}.DeleteExpired(ctx, conn)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted", n)
	// Output: deleted 1
}
