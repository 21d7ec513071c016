package collect

import "fmt"

// pg_ls_waldir() sizes the WAL directory. It needs superuser or pg_monitor;
// without them the collection goes on and slotwatch_wal_dir_bytes is absent.
// Same on 13 to 18.
const walDirQuery = `SELECT coalesce(sum(size), 0) AS wal_dir_bytes, count(*) AS wal_files FROM pg_ls_waldir()`

// WALDir is the size of pg_wal.
type WALDir struct {
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
}

func parseWALDir(rows []row) (*WALDir, error) {
	if len(rows) != 1 {
		return nil, fmt.Errorf("pg_ls_waldir: got %d rows", len(rows))
	}
	p := parser{r: rows[0]}
	d := &WALDir{}
	if b := p.int64("wal_dir_bytes"); b != nil {
		d.Bytes = *b
	}
	if n := p.int64("wal_files"); n != nil {
		d.Files = *n
	}
	return d, p.err()
}
