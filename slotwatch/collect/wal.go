package collect

import "fmt"

// The current WAL position: where WAL is written on a primary
// (pg_current_wal_lsn, what pg_wal_lsn_diff-based lag is measured from) and,
// on a standby, the last position received from the primary (or replayed,
// when nothing was streamed). CASE evaluates only the branch taken, so the
// primary-only function never runs during recovery. Same on 13 to 18.
const walPositionQuery = `SELECT pg_is_in_recovery() AS in_recovery,
       CASE WHEN pg_is_in_recovery()
            THEN coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())
            ELSE pg_current_wal_lsn()
       END AS wal_position`

func parseWALPosition(rows []row) (inRecovery bool, pos LSN, err error) {
	if len(rows) != 1 {
		return false, 0, fmt.Errorf("WAL position: got %d rows", len(rows))
	}
	p := parser{r: rows[0]}
	inRecovery = p.boolean("in_recovery")
	pos = p.lsn("wal_position")
	return inRecovery, pos, p.err()
}
