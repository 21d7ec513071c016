package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"
)

// sysFloor is the floor under any relay's latency on this machine: a bare
// relay in the bench process that reads pgoutput with pglogrepl and produces
// every inserted tuple as it is (no routing, no tracking, no confirmation)
// with franz-go, the connector's producer settings.
const sysFloor = "bare relay (floor)"

// floorReader streams a slot with pgoutput, keeps, for every insert, the time
// from the writer's commit clock (bench_t in the row) to its arrival, and
// produces the tuple to the current topic.
type floorReader struct {
	conn     *pgconn.PgConn
	kcl      *kgo.Client
	mu       sync.Mutex
	topic    string
	from, to int64
	recv     []float64
	inWindow int
	n        int
	done     chan struct{}
	err      error
}

// floorProducerOpts are the connector's producer settings (publish.ClientOpts
// with its defaults), written out so that the bench does not import connector
// packages.
func floorProducerOpts(brokers string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedRecords(10000),
		kgo.ProducerBatchMaxBytes(1048576),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()),
		kgo.ProducerLinger(0),
		kgo.UnknownTopicRetries(-1),
		kgo.MetadataMinAge(250 * time.Millisecond),
	}
}

func startFloorReader(ctx context.Context, dsn, brokers, slot string) (*floorReader, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("replication connection: %w", err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: []string{"proto_version '1'", "publication_names 'outbox_pub'"},
	}); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("start replication on %s: %w", slot, err)
	}
	kcl, err := kgo.NewClient(floorProducerOpts(brokers)...)
	if err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	f := &floorReader{conn: conn, kcl: kcl, from: math.MaxInt64, to: math.MaxInt64, done: make(chan struct{})}
	go f.run(ctx)
	return f, nil
}

func (f *floorReader) run(ctx context.Context) {
	defer close(f.done)
	var received uint64
	nextStatus := time.Now()
	for ctx.Err() == nil {
		if !time.Now().Before(nextStatus) {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, f.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(received)}); err != nil {
				f.err = err
				return
			}
			nextStatus = time.Now().Add(time.Second)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := f.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			if ctx.Err() == nil {
				f.err = err
			}
			return
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			if er, ok := msg.(*pgproto3.ErrorResponse); ok {
				f.err = errors.New(er.Message)
				return
			}
			continue
		}
		now := time.Now().UnixNano()
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err == nil && ka.ReplyRequested {
				nextStatus = time.Time{}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				f.err = err
				return
			}
			received = uint64(x.WALStart) + uint64(len(x.WALData))
			if len(x.WALData) == 0 || x.WALData[0] != 'I' {
				continue
			}
			t, ok := benchT(x.WALData)
			if !ok {
				continue
			}
			f.mu.Lock()
			if t >= f.from && t < f.to {
				f.inWindow++
				f.recv = append(f.recv, float64(now-t)/1e6)
			}
			topic := f.topic
			f.n++
			key := strconv.AppendInt(nil, int64(f.n%1000), 10)
			f.mu.Unlock()
			if topic != "" {
				f.kcl.Produce(ctx, &kgo.Record{Topic: topic, Key: key, Value: append([]byte(nil), x.WALData...)}, nil)
			}
		}
	}
}

func (f *floorReader) setWindow(topic string, from, to time.Time) {
	f.mu.Lock()
	f.topic = topic
	f.from, f.to = from.UnixNano(), to.UnixNano()
	f.recv, f.inWindow = nil, 0
	f.mu.Unlock()
}

func (f *floorReader) close() {
	f.conn.Close(context.Background())
	<-f.done
	f.kcl.Close()
}

// floorLevel measures the bare relay under one load level.
func (b *bench) floorLevel(ctx context.Context, rate, perTx int, w *writers) LatencyRun {
	b.log.Info("latency", "system", sysFloor, "rate", rate, "events_per_tx", perTx)
	r := LatencyRun{System: sysFloor, Rate: rate, EventsPerTx: perTx, TxPerSec: float64(rate) / float64(perTx), Seconds: b.cfg.Measure.Seconds()}
	fail := func(err error) LatencyRun {
		r.Error = err.Error()
		return r
	}
	conn, err := b.env.connect(ctx)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())
	slot := fmt.Sprintf("lat_floor_%d", rate)
	if err := b.env.createSlot(ctx, conn, slot); err != nil {
		return fail(err)
	}
	defer b.env.dropSlot(context.Background(), slot)
	aggType := slot
	topic := "outbox.event." + aggType
	if err := b.env.createTopic(ctx, topic); err != nil {
		return fail(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f, err := startFloorReader(rctx, b.env.dsn(), b.env.brokers, slot)
	if err != nil {
		return fail(err)
	}
	defer func() { cancel(); f.close() }()
	c, err := startConsumer(ctx, b.env.brokers, topic)
	if err != nil {
		return fail(err)
	}
	defer c.close()
	start := time.Now().Add(50 * time.Millisecond)
	from := start.Add(b.cfg.Warmup)
	f.setWindow(topic, from, from.Add(b.cfg.Measure))
	c.setWindow(from, from.Add(b.cfg.Measure))
	lr := w.load(ctx, aggType, rate, perTx, start, b.cfg.Warmup, b.cfg.Measure)
	if lr.err != nil {
		r.Error = "writer: " + lr.err.Error()
	}
	r.Sent, r.LateStarts = lr.sent, lr.late
	r.AchievedRate = float64(lr.sent) / b.cfg.Measure.Seconds()
	deadline := time.Now().Add(30 * time.Second)
	for c.count() < lr.sent && time.Now().Before(deadline) && f.err == nil {
		time.Sleep(20 * time.Millisecond)
	}
	f.mu.Lock()
	recv := percentiles(append([]float64(nil), f.recv...))
	f.mu.Unlock()
	r.CommitToReceived = &recv
	c.fill(&r, lr)
	if f.err != nil && r.Error == "" {
		r.Error = "reader: " + f.err.Error()
	}
	if r.Received < r.Sent && r.Error == "" {
		r.Error = fmt.Sprintf("%d of %d events did not reach the consumer within 30s of the load's end", r.Sent-r.Received, r.Sent)
	}
	return r
}
