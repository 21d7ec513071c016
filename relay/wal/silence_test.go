package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/pgoutbox/relay/tracker"
)

// silenceTimeout is the tests' SilenceTimeout; silenceMargin is how late
// past it the stream may notice (a loop wake-up, scheduling under -race on
// a shared machine), never how early.
const (
	silenceTimeout = 800 * time.Millisecond
	silenceMargin  = time.Second
)

// walsender is the server end of a net.Pipe that a stream reads: it
// accepts the startup and START_REPLICATION, then does what its test says.
// A net.Pipe has no buffer: a write blocks until the other side reads, so a
// walsender that stops reading is a path that takes nothing.
type walsender struct {
	be   *pgproto3.Backend
	conn net.Conn

	mu     sync.Mutex
	probes []time.Time // status updates that asked for a reply, as received
}

// statusUpdates reads the stream's messages until the connection ends,
// recording the status updates that ask for a reply and, if answer, answering
// each with a keepalive.
func (w *walsender) statusUpdates(answer bool) {
	for {
		msg, err := w.be.Receive()
		if err != nil {
			return
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) != 34 || cd.Data[0] != 'r' || cd.Data[33] != 1 {
			continue
		}
		w.mu.Lock()
		w.probes = append(w.probes, time.Now())
		w.mu.Unlock()
		if answer {
			w.send(keepaliveMsg(1000, false))
		}
	}
}

func (w *walsender) send(data []byte) {
	w.be.Send(&pgproto3.CopyData{Data: data})
	_ = w.be.Flush()
}

func (w *walsender) probed() []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Time(nil), w.probes...)
}

// keepaliveMsg is a primary keepalive ('k'): WAL end, send time, reply flag.
func keepaliveMsg(walEnd uint64, reply bool) []byte {
	b := binary.BigEndian.AppendUint64([]byte{'k'}, walEnd)
	b = binary.BigEndian.AppendUint64(b, uint64(time.Now().UnixMicro()-pgEpoch.UnixMicro()))
	if reply {
		return append(b, 1)
	}
	return append(b, 0)
}

type silenceRig struct {
	*Stream
	ws     *walsender
	out    chan Event
	silent atomic.Int32
}

// newSilenceRig is a Stream with SilenceTimeout over a net.Pipe to a
// walsender that, once streaming, runs serve.
func newSilenceRig(t *testing.T, serve func(*walsender)) *silenceRig {
	t.Helper()
	client, server := net.Pipe()
	ws := &walsender{be: pgproto3.NewBackend(server, server), conn: server}
	t.Cleanup(func() { client.Close(); server.Close() })
	go func() {
		if _, err := ws.be.ReceiveStartupMessage(); err != nil {
			return
		}
		ws.be.Send(&pgproto3.AuthenticationOk{})
		ws.be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 2}})
		ws.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if ws.be.Flush() != nil {
			return
		}
		if msg, err := ws.be.Receive(); err != nil {
			return
		} else if q, ok := msg.(*pgproto3.Query); !ok || !strings.HasPrefix(q.String, "START_REPLICATION") {
			return
		}
		ws.be.Send(&pgproto3.CopyBothResponse{})
		if ws.be.Flush() != nil {
			return
		}
		serve(ws)
	}()
	cfg, err := pgconn.ParseConfig("postgres://u@127.0.0.1:1/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = func(context.Context, string, string) (net.Conn, error) { return client, nil }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &silenceRig{ws: ws, out: make(chan Event)}
	r.Stream = &Stream{
		Conn: conn, Slot: "outbox_slot", Publication: "outbox_pub", Schema: "public", Table: "outbox",
		Tracker: tracker.New(100), Out: r.out, Position: ConfirmFunc(func() uint64 { return 0 }),
		StatusInterval: 100 * time.Millisecond, StopGrace: time.Second, SilenceTimeout: silenceTimeout,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Counters: Counters{Silent: func() { r.silent.Add(1) }},
	}
	return r
}

// run starts Run; the returned channel has its error.
func (r *silenceRig) run(ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, 100) }()
	return done
}

// wantSilent waits for Run's end, which must be the silence error no
// sooner than silenceTimeout after from and within the margin, counted
// once; it returns how long after from it came.
func (r *silenceRig) wantSilent(t *testing.T, done <-chan error, from time.Time) time.Duration {
	t.Helper()
	var err error
	select {
	case err = <-done:
	case <-time.After(silenceTimeout + silenceMargin + 5*time.Second):
		t.Fatalf("Run still running %s after the server went silent (SilenceTimeout %s)", time.Since(from), silenceTimeout)
	}
	took := time.Since(from)
	if !errors.Is(err, ErrSilent) {
		t.Fatalf("Run ended with %v after %s; want ErrSilent", err, took)
	}
	for _, want := range []string{"no message from the server for", `on slot "outbox_slot"`, "the network path may be silent; reconnecting"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if took < silenceTimeout || took > silenceTimeout+silenceMargin {
		t.Errorf("the silence was noticed %s after it began; want between %s and %s", took, silenceTimeout, silenceTimeout+silenceMargin)
	}
	if n := r.silent.Load(); n != 1 {
		t.Errorf("Counters.Silent called %d times; want 1", n)
	}
	t.Logf("noticed %s after the server went silent: %v", took.Round(time.Millisecond), err)
	return took
}

// TestStreamSilence (issue 35, item 8): a replication connection whose
// path goes silent (no FIN, no RST) ends the stream with ErrSilent about
// SilenceTimeout after the server's last message, whether the path still
// takes the stream's writes or not, having asked for a reply on the way;
// the connection can then be closed at once. A server that answers when
// asked keeps an idle stream alive, and time spent waiting for the
// producer is not silence.
func TestStreamSilence(t *testing.T) {
	t.Run("path takes nothing", func(t *testing.T) {
		// The walsender neither reads nor writes: the first status update
		// blocks in the write, which its deadline ends.
		hold := make(chan struct{})
		t.Cleanup(func() { close(hold) })
		r := newSilenceRig(t, func(*walsender) { <-hold })
		began := time.Now()
		r.wantSilent(t, r.run(context.Background()), began)
		closed := make(chan struct{})
		go func() { _ = r.Conn.Close(context.Background()); close(closed) }()
		select {
		case <-closed:
		case <-time.After(2 * time.Second):
			t.Fatal("closing the connection blocked on a path that takes nothing")
		}
	})

	t.Run("path takes writes, answers nothing", func(t *testing.T) {
		// Status updates leave (as into a kernel's send buffer), reads time
		// out: the usual blackhole.
		r := newSilenceRig(t, func(w *walsender) { w.statusUpdates(false) })
		began := time.Now()
		r.wantSilent(t, r.run(context.Background()), began)
		probes := r.ws.probed()
		if len(probes) != 1 {
			t.Fatalf("%d status updates asked for a reply; want 1", len(probes))
		}
		if at := probes[0].Sub(began); at < silenceTimeout/4 || at > silenceTimeout/4+silenceMargin/2 {
			t.Errorf("the reply was asked for %s in; want about a quarter of SilenceTimeout (%s)", at, silenceTimeout/4)
		}
	})

	t.Run("server answers when asked", func(t *testing.T) {
		// An idle walsender sends nothing unprompted; asked, it answers.
		r := newSilenceRig(t, func(w *walsender) { w.statusUpdates(true) })
		ctx, cancel := context.WithCancel(context.Background())
		done := r.run(ctx)
		select {
		case err := <-done:
			t.Fatalf("Run ended with %v while the server answered every probe", err)
		case <-time.After(4 * silenceTimeout):
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run after the stop: %v", err)
		}
		if n := len(r.ws.probed()); n < 4 {
			t.Errorf("%d probes in %s; want one per quarter of SilenceTimeout since the last answer (about 16)", n, 4*silenceTimeout)
		}
		if n := r.silent.Load(); n != 0 {
			t.Errorf("Counters.Silent called %d times; want 0", n)
		}
	})

	t.Run("a stop on a silent path is bounded", func(t *testing.T) {
		// A graceful stop sends the final position and waits for the
		// server to end the copy: on a silent path, for the timeout at
		// most (it waited 30 s before).
		r := newSilenceRig(t, func(w *walsender) { w.statusUpdates(false) })
		ctx, cancel := context.WithCancel(context.Background())
		done := r.run(ctx)
		time.Sleep(silenceTimeout / 2)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run after the stop: %v", err)
		}
		began := time.Now()
		err := r.Finish(context.Background(), nil)
		took := time.Since(began)
		t.Logf("Finish returned after %s: %v", took.Round(time.Millisecond), err)
		if err == nil || took > silenceTimeout+silenceMargin {
			t.Errorf("Finish on a silent path: %v after %s; want an error within %s", err, took, silenceTimeout+silenceMargin)
		}
	})

	t.Run("waiting for the producer is not silence", func(t *testing.T) {
		// An outbox insert, then nothing more; the producer takes the
		// event only after twice the timeout. The stream reads nothing
		// meanwhile: the silence counts from when it reads again.
		r := newSilenceRig(t, func(w *walsender) {
			// Reading meanwhile (a net.Pipe has no buffer): it only reads.
			go w.statusUpdates(false)
			w.send(xlog(200, benchBegin(300)))
			w.send(xlog(210, benchRelation()))
			w.send(xlog(220, benchInsert()))
		})
		done := r.run(context.Background())
		select {
		case err := <-done:
			t.Fatalf("Run ended with %v while the producer was full", err)
		case <-time.After(2 * silenceTimeout):
		}
		took := time.Now()
		select {
		case ev := <-r.out:
			ev.Txn.Done()
		case err := <-done:
			t.Fatalf("Run ended with %v before the producer took the event", err)
		}
		r.wantSilent(t, done, took)
	})
}
