package route

import "github.com/twmb/franz-go/pkg/kgo"

// Partitioner returns the partitioner a producer of routed records should
// use: a record whose Partition is 0 or more (a partition placement chose
// it) goes to that partition, and fails if the topic has no such partition,
// as Kafka's producer fails; any other record (Route sets -1) is placed by
// Kafka's default: murmur2 of the key, sticky for null keys
// (kgo.StickyKeyPartitioner). Records not made by Route must set
// Partition to -1 too.
func Partitioner() kgo.Partitioner {
	return explicitPartitioner{inner: kgo.StickyKeyPartitioner(nil)}
}

type explicitPartitioner struct{ inner kgo.Partitioner }

func (p explicitPartitioner) ForTopic(t string) kgo.TopicPartitioner {
	return &explicitTopicPartitioner{inner: p.inner.ForTopic(t)}
}

type explicitTopicPartitioner struct{ inner kgo.TopicPartitioner }

func (p *explicitTopicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return r.Partition >= 0 || p.inner.RequiresConsistency(r)
}

func (p *explicitTopicPartitioner) Partition(r *kgo.Record, n int) int {
	if r.Partition >= 0 {
		return int(r.Partition)
	}
	return p.inner.Partition(r, n)
}

func (p *explicitTopicPartitioner) OnNewBatch() {
	if nb, ok := p.inner.(kgo.TopicPartitionerOnNewBatch); ok {
		nb.OnNewBatch()
	}
}
