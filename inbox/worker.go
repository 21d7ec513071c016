package inbox

import (
	"context"
	"errors"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Each assigned partition has a worker: a goroutine that handles the
// partition's records in order, one at a time, from a queue the poll loop
// fills. The poll loop itself only hands records out, so a partition never
// waits for another's work. (It did when a member handled each poll before
// taking the next: franz-go, as Java's consumer, hands out what it fetched
// partition by partition, and fetches again only once all of it is taken,
// so a partition waited for up to one fetch of each other partition, 1 MiB
// of records by default, 11-12 s measured; franz-go's goroutine-per-partition
// examples are the model.)
//
// A queue is bounded: at maxQueued records or maxQueuedBytes bytes its
// partition's fetching is paused (franz-go drops what it has buffered for a
// paused partition and fetches it again after a resume), and resumed once
// the queue is down to half.
//
// A revoke or loss of partitions stops their workers after the attempt in
// flight (a wait between attempts ends at once), waits for them, and only
// then lets the rebalance go on; records still queued are left, unmarked, to
// the next owner. Rebalances cannot interleave with handing records out
// (BlockRebalanceOnPoll), so a partition never has two workers.

// tp is a topic partition.
type tp struct {
	topic     string
	partition int32
}

func (p tp) m() map[string][]int32 { return map[string][]int32{p.topic: {p.partition}} }

// maxQueuedBytes bounds a partition's queue in bytes of keys, values and
// headers, as
// maxQueued (Config.MaxPollRecords) bounds it in records: about one fetch of
// a partition at franz-go's default (max.partition.fetch.bytes, 1 MiB).
const maxQueuedBytes = 1 << 20

// errStopped is what handle returns when its worker was stopped (the
// partition revoked) before the record was done: it is left to the next
// owner, unmarked.
var errStopped = errors.New("inbox: partition revoked")

type worker struct {
	c    *Consumer
	tp   tp
	stop chan struct{} // closed: end after the attempt in flight
	done chan struct{} // closed when run returned
	wake chan struct{} // 1-buffered: records were queued

	mu     sync.Mutex
	queue  []*kgo.Record
	bytes  int
	paused bool
}

func recordBytes(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// push queues records of the partition, pausing its fetching when the queue
// is full.
func (w *worker) push(recs []*kgo.Record) {
	w.mu.Lock()
	w.queue = append(w.queue, recs...)
	for _, r := range recs {
		w.bytes += recordBytes(r)
	}
	if !w.paused && (len(w.queue) >= w.c.cfg.MaxPollRecords || w.bytes >= maxQueuedBytes) {
		w.paused = true
		w.c.cl.PauseFetchPartitions(w.tp.m())
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// next takes the queue's first record (nil when it is empty), resuming the
// partition's fetching once the queue is down to half.
func (w *worker) next() *kgo.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) == 0 {
		return nil
	}
	r := w.queue[0]
	w.queue[0] = nil
	w.queue = w.queue[1:]
	w.bytes -= recordBytes(r)
	if w.paused && len(w.queue) <= w.c.cfg.MaxPollRecords/2 && w.bytes <= maxQueuedBytes/2 {
		w.paused = false
		w.c.cl.ResumeFetchPartitions(w.tp.m())
	}
	return r
}

// run handles the queued records until stopped or ctx is done; an error
// other than those (a dead letter Kafka refuses for good) goes to fail.
func (w *worker) run(ctx context.Context, fail func(error)) {
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		r := w.next()
		if r == nil {
			select {
			case <-w.wake:
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			}
			continue
		}
		if err := w.c.handle(ctx, w.stop, r); err != nil {
			// A refused dead letter is said even when Run is stopping.
			if errors.Is(err, ErrDeadLetterRefused) || !errors.Is(err, errStopped) && ctx.Err() == nil {
				fail(err)
			}
			return
		}
		w.c.cl.MarkCommitRecords(r)
	}
}

// workers are a Consumer's partition workers during one Run.
type workers struct {
	c    *Consumer
	ctx  context.Context // the workers': done when Run stops
	fail func(error)

	mu sync.Mutex
	m  map[tp]*worker
}

// push hands a partition's records to its worker, starting one for a
// partition that has none. Called by the poll loop only, while rebalances
// wait.
func (ws *workers) push(p kgo.FetchTopicPartition) {
	k := tp{p.Topic, p.Partition}
	ws.mu.Lock()
	w := ws.m[k]
	if w == nil {
		w = &worker{c: ws.c, tp: k, stop: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1)}
		ws.m[k] = w
		go w.run(ws.ctx, ws.fail)
	}
	ws.mu.Unlock()
	w.push(p.Records)
}

// stop stops the workers of parts (none when parts is empty), waits for
// them, and resumes the partitions' fetching: franz-go keeps a pause across
// rebalances, and a partition assigned back later would never be fetched.
// Called by the rebalance callbacks, which never overlap each other, the
// poll loop's hand-out or Run's end.
func (ws *workers) stop(parts map[string][]int32) {
	if len(parts) == 0 {
		return
	}
	ws.halt(func(k tp) bool { return has(parts, k) })
	ws.c.cl.ResumeFetchPartitions(parts)
}

// stopAll stops every worker and waits for them (Run's end).
func (ws *workers) stopAll() { ws.halt(func(tp) bool { return true }) }

func (ws *workers) halt(match func(tp) bool) {
	ws.mu.Lock()
	var stopped []*worker
	for k, w := range ws.m {
		if match(k) {
			close(w.stop)
			delete(ws.m, k)
			stopped = append(stopped, w)
		}
	}
	ws.mu.Unlock()
	for _, w := range stopped {
		<-w.done
	}
}

func has(parts map[string][]int32, k tp) bool {
	for _, p := range parts[k.topic] {
		if p == k.partition {
			return true
		}
	}
	return false
}
