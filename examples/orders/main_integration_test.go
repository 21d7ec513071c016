package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestPlaceOrderOverHTTP: POST /orders commits the order and its
// OrderPlaced outbox row together; a bad body is refused; SIGTERM (ctx)
// stops the server cleanly.
func TestPlaceOrderOverHTTP(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	env := map[string]string{"ORDERS_PG_DSN": pg.DSN("outbox"), "ORDERS_LISTEN": "127.0.0.1:0"}
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }, pw, io.Discard) }()
	addr, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url := "http://" + strings.TrimSpace(addr) + "/orders"
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"customer":"ada","amount_cents":1299}`))
	if err != nil {
		t.Fatal(err)
	}
	var placed struct {
		ID string `json:"id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&placed)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || placed.ID == "" {
		t.Fatalf("POST /orders: %d, id %q", resp.StatusCode, placed.ID)
	}
	conn := pg.Conn(t, "outbox")
	var payload string
	if err := conn.QueryRow(ctx, `SELECT o.payload::text FROM outbox o JOIN orders r ON r.id = o.aggregateid
		WHERE o.aggregatetype = 'Order' AND o.type = 'OrderPlaced' AND r.id = $1`, placed.ID).Scan(&payload); err != nil {
		t.Fatalf("order %s and its event: %v", placed.ID, err)
	}
	if !strings.Contains(payload, `"amount_cents": 1299`) {
		t.Errorf("payload %s", payload)
	}
	resp, err = http.Post(url, "application/json", strings.NewReader(`{"customer":""}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad body: %d, want 400", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}
