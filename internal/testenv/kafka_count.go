package testenv

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CommittedRecords counts the records of topic below its last stable
// offsets, without decoding them: with Kafka transactions, offsets also
// count the transaction markers, and consuming a million records through a
// client built with -race takes minutes. It reads the record batch headers
// of read_committed fetches and sums the record counts of data batches
// (control batches, the markers, are skipped). Records of aborted
// transactions are counted too: a test that expects none sees them as
// extra.
func CommittedRecords(ctx context.Context, brokers, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	details, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, err
	}
	td, ok := details[topic]
	if !ok || td.Err != nil {
		return 0, fmt.Errorf("topic %s: %v", topic, td.Err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, pd := range td.Partitions.Sorted() {
		s, _ := starts.Lookup(topic, pd.Partition)
		e, _ := ends.Lookup(topic, pd.Partition)
		for off := s.Offset; off < e.Offset; {
			req := kmsg.NewPtrFetchRequest()
			req.ReplicaID = -1
			req.MaxWaitMillis = 100
			req.MaxBytes = 64 << 20
			req.IsolationLevel = 1 // read_committed
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic = topic
			rt.TopicID = td.ID
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition = pd.Partition
			rp.FetchOffset = off
			rp.PartitionMaxBytes = 32 << 20
			rp.CurrentLeaderEpoch = -1
			rp.LogStartOffset = -1
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, cl.Broker(int(pd.Leader)))
			if err != nil {
				return 0, fmt.Errorf("fetch %s/%d at %d: %w", topic, pd.Partition, off, err)
			}
			if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
				return 0, fmt.Errorf("fetch %s/%d at %d: unexpected response shape", topic, pd.Partition, off)
			}
			p := resp.Topics[0].Partitions[0]
			if p.ErrorCode != 0 {
				return 0, fmt.Errorf("fetch %s/%d at %d: error code %d", topic, pd.Partition, off, p.ErrorCode)
			}
			raw := p.RecordBatches
			progressed := false
			for len(raw) >= 12 {
				n := 12 + int(binary.BigEndian.Uint32(raw[8:12]))
				if n > len(raw) {
					break // a partial batch at the end of the response
				}
				var b kmsg.RecordBatch
				if err := b.ReadFrom(raw[:n]); err != nil {
					return 0, fmt.Errorf("read a record batch of %s/%d: %w", topic, pd.Partition, err)
				}
				raw = raw[n:]
				next := b.FirstOffset + int64(b.LastOffsetDelta) + 1
				if next <= off {
					continue
				}
				if b.Attributes&0x20 == 0 { // not a control batch
					total += int64(b.NumRecords)
				}
				off = next
				progressed = true
			}
			if !progressed {
				return 0, fmt.Errorf("fetch %s/%d at %d: no progress below the last stable offset %d", topic, pd.Partition, off, e.Offset)
			}
		}
	}
	return total, nil
}
