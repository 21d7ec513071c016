package collect

import "fmt"

// pg_stat_replication_slots appeared in 14 (logical slots only); its columns
// are the same from 14 to 18. On 13 nothing is queried.
const statReplicationSlotsQuery14 = `SELECT slot_name, spill_txns, spill_count, spill_bytes,
       stream_txns, stream_count, stream_bytes, total_txns, total_bytes
FROM pg_stat_replication_slots
ORDER BY slot_name`

func statReplicationSlotsQuery(version int) string {
	if version >= 140000 {
		return statReplicationSlotsQuery14
	}
	return ""
}

// SlotStats is one row of pg_stat_replication_slots: decoding counters
// since the last stats reset.
type SlotStats struct {
	SpillTxns   int64 `json:"spill_txns"`
	SpillCount  int64 `json:"spill_count"`
	SpillBytes  int64 `json:"spill_bytes"`
	StreamTxns  int64 `json:"stream_txns"`
	StreamCount int64 `json:"stream_count"`
	StreamBytes int64 `json:"stream_bytes"`
	TotalTxns   int64 `json:"total_txns"`
	TotalBytes  int64 `json:"total_bytes"`
}

func parseSlotStats(rows []row) (map[string]SlotStats, error) {
	out := make(map[string]SlotStats, len(rows))
	for _, r := range rows {
		p := parser{r: r}
		name := p.str("slot_name")
		get := func(col string) int64 {
			if v := p.int64(col); v != nil {
				return *v
			}
			return 0
		}
		out[name] = SlotStats{
			SpillTxns:   get("spill_txns"),
			SpillCount:  get("spill_count"),
			SpillBytes:  get("spill_bytes"),
			StreamTxns:  get("stream_txns"),
			StreamCount: get("stream_count"),
			StreamBytes: get("stream_bytes"),
			TotalTxns:   get("total_txns"),
			TotalBytes:  get("total_bytes"),
		}
		if err := p.err(); err != nil {
			return nil, fmt.Errorf("pg_stat_replication_slots row %q: %w", name, err)
		}
	}
	return out, nil
}
