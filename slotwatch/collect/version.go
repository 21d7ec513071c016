package collect

import (
	"fmt"
	"strconv"
)

// Versions slotwatch knows. A newer server is read with the newest queries
// (its views only ever gained columns so far), and logged.
const (
	MinVersion    = 130000 // wal_status and safe_wal_size appeared in 13
	NewestVersion = 180000
)

const versionQuery = `SELECT current_setting('server_version_num') AS server_version_num,
       current_setting('server_version') AS server_version`

// Major is the major version of a server_version_num: 150010 is 15.
func Major(num int) int { return num / 10000 }

func parseVersion(rows []row) (int, string, error) {
	if len(rows) != 1 {
		return 0, "", fmt.Errorf("server version: got %d rows", len(rows))
	}
	p := parser{r: rows[0]}
	numText := p.str("server_version_num")
	num, err := strconv.Atoi(numText)
	if err != nil {
		return 0, "", fmt.Errorf("server_version_num %q is not a number", numText)
	}
	if num < MinVersion {
		return num, p.str("server_version"), fmt.Errorf("PostgreSQL %s is not supported: slotwatch needs 13 or newer (wal_status, safe_wal_size)", p.str("server_version"))
	}
	return num, p.str("server_version"), nil
}
