package publish

import (
	"runtime/debug"
)

// BufferedBytes is how many bytes of records the producer buffers at most
// for a given OUTBOX_KAFKA_MAX_MESSAGE_BYTES: 16 MiB, or four of the largest
// records if that is more.
func BufferedBytes(maxMessageBytes int) int {
	return max(minBufferedBytes, 4*maxMessageBytes)
}

// memoryBase is what the connector needs besides the producer's buffer: the
// hand-over between stream and producer, the records kept until their Kafka
// transaction commits, the read buffers.
const memoryBase = 24 << 20

// SetMemoryLimit gives the Go runtime a soft memory limit that suits the
// connector, unless GOMEMLIMIT is set (the runtime then honours it, "off"
// included). Without one the heap doubles between collections and a drain
// peaks at about 90 MiB of RSS; with it the collector works harder as the
// heap nears the limit instead (a backlog drain measured 58-62 MiB, at no
// visible cost in throughput). The limit is soft: a heap that needs more
// gets it, at the price of more collection. It returns the limit set, or 0.
func SetMemoryLimit(getenv func(string) string, maxMessageBytes int) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := int64(memoryBase + BufferedBytes(maxMessageBytes))
	debug.SetMemoryLimit(limit)
	return limit
}
