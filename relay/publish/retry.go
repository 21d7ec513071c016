package publish

import (
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TxnRetryOpts are the retry settings of a transactional client: the
// backoff franz-go waits before it retries a request (txnRetryBackoff),
// counting the retries since Kafka last took a batch. Each call makes a
// new count, for one client.
//
// franz-go's own count is not enough: it counts a produce request's
// failures and clears the count whenever a request is answered, and a
// retriable error that Kafka gives for one partition (a request timed out,
// not enough replicas after the append) comes in an answered request. A
// partition that fails so for minutes was retried at the backoff's first
// step, about a hundred times a second, for as long as it lasted. The
// count here grows with every retry, of any request, until a batch is
// written: a passing CONCURRENT_TRANSACTIONS after a commit is still
// retried after 10 ms, a lasting error soon only once a second.
func TxnRetryOpts() []kgo.Opt {
	b := &retryCount{}
	return []kgo.Opt{kgo.RetryBackoffFn(b.backoff), kgo.WithHooks(b)}
}

// retryCount counts a client's retries since Kafka last took a batch.
type retryCount struct{ n atomic.Int32 }

func (c *retryCount) backoff(fails int) time.Duration {
	// The count stops growing where the backoff stops growing, so that it
	// cannot overflow however long an error lasts.
	n := c.n.Add(1)
	if n > 64 {
		c.n.Store(64)
	}
	return txnRetryBackoff(max(fails, int(n)))
}

// OnProduceBatchWritten is franz-go's hook for a batch Kafka took: what
// failed before has passed.
func (c *retryCount) OnProduceBatchWritten(kgo.BrokerMetadata, string, int32, kgo.ProduceBatchMetrics) {
	c.n.Store(0)
}

// txnRetryBackoff replaces franz-go's default retry backoff (250 ms to 5 s)
// for transactional clients. Since KIP-890, the first produce request of a
// transaction begun right after the previous one ended may be answered
// CONCURRENT_TRANSACTIONS while the broker still writes the commit markers;
// franz-go retries it like any retriable produce error, and with a commit
// every few milliseconds 250 ms there would be the connector's latency. It
// grows from 10 ms to 1 s, with jitter, over the first eight retries.
// Written here, not taken from internal/retry: franz-go asks for the wait of
// a given failure count (kgo.RetryBackoffFn), a function of the count, and
// the library's ExponentialBackOff is a sequence with state.
func txnRetryBackoff(fails int) time.Duration {
	d := 10 * time.Millisecond << min(max(fails-1, 0), 7)
	d = min(d, time.Second)
	return d - time.Duration(rand.Int64N(int64(d)/5))
}
