package collect

import "fmt"

// pg_stat_replication: one row per WAL sender, joined to its slot by
// active_pid. The columns slotwatch reads are the same on 13 to 18. Lags are
// intervals, returned as seconds.
const statReplicationQuery = `SELECT pid, usename, application_name, client_addr, state,
       sent_lsn, write_lsn, flush_lsn, replay_lsn,
       extract(epoch FROM write_lag) AS write_lag,
       extract(epoch FROM flush_lag) AS flush_lag,
       extract(epoch FROM replay_lag) AS replay_lag,
       sync_state,
       extract(epoch FROM clock_timestamp() - reply_time) AS reply_age
FROM pg_stat_replication
ORDER BY pid`

// Sender is one row of pg_stat_replication. Without pg_read_all_stats, rows
// of other users show NULLs, which stay zero here.
type Sender struct {
	PID             int64    `json:"pid"`
	User            string   `json:"usename,omitempty"`
	ApplicationName string   `json:"application_name,omitempty"`
	ClientAddr      string   `json:"client_addr,omitempty"`
	State           string   `json:"state,omitempty"`
	SentLSN         LSN      `json:"sent_lsn"`
	WriteLSN        LSN      `json:"write_lsn"`
	FlushLSN        LSN      `json:"flush_lsn"`
	ReplayLSN       LSN      `json:"replay_lsn"`
	WriteLag        *float64 `json:"write_lag_seconds,omitempty"`
	FlushLag        *float64 `json:"flush_lag_seconds,omitempty"`
	ReplayLag       *float64 `json:"replay_lag_seconds,omitempty"`
	SyncState       string   `json:"sync_state,omitempty"`
	ReplyAge        *float64 `json:"reply_age_seconds,omitempty"`
}

func parseSenders(rows []row) ([]Sender, error) {
	out := make([]Sender, 0, len(rows))
	for _, r := range rows {
		p := parser{r: r}
		s := Sender{
			User:            p.str("usename"),
			ApplicationName: p.str("application_name"),
			ClientAddr:      p.str("client_addr"),
			State:           p.str("state"),
			SentLSN:         p.lsn("sent_lsn"),
			WriteLSN:        p.lsn("write_lsn"),
			FlushLSN:        p.lsn("flush_lsn"),
			ReplayLSN:       p.lsn("replay_lsn"),
			WriteLag:        p.float("write_lag"),
			FlushLag:        p.float("flush_lag"),
			ReplayLag:       p.float("replay_lag"),
			SyncState:       p.str("sync_state"),
			ReplyAge:        p.float("reply_age"),
		}
		if pid := p.int64("pid"); pid != nil {
			s.PID = *pid
		}
		if err := p.err(); err != nil {
			return nil, fmt.Errorf("pg_stat_replication row pid %d: %w", s.PID, err)
		}
		out = append(out, s)
	}
	return out, nil
}
