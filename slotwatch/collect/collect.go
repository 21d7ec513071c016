// Package collect reads, from one PostgreSQL server (13 to 18), everything
// slotwatch watches: the replication slots, the current WAL position, the
// WAL senders, the slots' decoding statistics, the settings that bound WAL
// retention and the size of the WAL directory. Each view has its own file
// with its SQL in named constants, chosen by server_version_num.
package collect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Snapshot is one collection from one server.
type Snapshot struct {
	// Time is when the WAL position was read (slotwatch's clock).
	Time time.Time `json:"time"`
	// Duration is how long the collection took.
	Duration   time.Duration `json:"-"`
	VersionNum int           `json:"server_version_num"`
	Version    string        `json:"server_version"`
	// SystemID is the cluster's system identifier (pg_control_system()),
	// which a physical standby shares with its primary; empty when the
	// role may not read it.
	SystemID   string `json:"system_identifier,omitempty"`
	InRecovery bool   `json:"in_recovery"`
	// WALPosition is pg_current_wal_lsn() on a primary and the last received
	// (or replayed) position on a standby.
	WALPosition LSN                  `json:"wal_position"`
	Slots       []Slot               `json:"slots"`
	Senders     []Sender             `json:"senders,omitempty"`
	SlotStats   map[string]SlotStats `json:"slot_stats,omitempty"`
	Settings    Settings             `json:"settings"`
	// WALDir is nil when pg_ls_waldir() is not permitted.
	WALDir *WALDir `json:"wal_dir,omitempty"`
}

// Collector reads snapshots from one server over one connection, which it
// opens on first use and again after it broke: a database that goes away
// and comes back needs nothing from the operator.
type Collector struct {
	cfg *pgx.ConnConfig
	log *slog.Logger

	conn         *pgx.Conn
	versionNum   int
	version      string
	systemID     string
	walDirDenied bool
}

// systemIDQuery reads the cluster's system identifier, once per connection.
const systemIDQuery = `SELECT system_identifier::text FROM pg_control_system()`

// New parses dsn; nothing connects until Collect.
func New(dsn string, log *slog.Logger) (*Collector, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse connection string: %w", err)
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "slotwatch"
	}
	return &Collector{cfg: cfg, log: log}, nil
}

// Close closes the connection, if open.
func (c *Collector) Close(ctx context.Context) {
	if c.conn != nil {
		_ = c.conn.Close(ctx)
		c.conn = nil
	}
}

// Collect reads one snapshot. ctx bounds the whole collection, connecting
// included. After an error the connection is dropped unless the server
// answered with an SQL error, so the next call starts afresh.
func (c *Collector) Collect(ctx context.Context) (snap *Snapshot, err error) {
	start := time.Now()
	if c.conn == nil || c.conn.IsClosed() {
		if err := c.connect(ctx); err != nil {
			return nil, err
		}
	}
	defer func() {
		// A server-side SQL error leaves the connection usable; anything else
		// (network, timeout, protocol) may have left it mid-message.
		var pgErr *pgconn.PgError
		if err != nil && !errors.As(err, &pgErr) {
			c.Close(context.Background())
		}
	}()
	return c.read(ctx, start)
}

func (c *Collector) connect(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, c.cfg.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	rows, err := queryRows(ctx, conn, versionQuery)
	if err != nil {
		_ = conn.Close(ctx)
		return fmt.Errorf("read server version: %w", err)
	}
	num, ver, err := parseVersion(rows)
	if err != nil {
		_ = conn.Close(ctx)
		return err
	}
	if num >= NewestVersion+10000 {
		c.log.Warn("server is newer than the versions slotwatch knows; reading it as the newest known", "server_version", ver, "newest_known", Major(NewestVersion))
	}
	var sysID string
	if err := conn.QueryRow(ctx, systemIDQuery).Scan(&sysID); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			_ = conn.Close(ctx)
			return fmt.Errorf("read the system identifier: %w", err)
		}
		// Allowed to fail: only failover readiness needs it.
		c.log.Info("system identifier not readable: failover readiness cannot pair this server with its standbys; grant EXECUTE ON FUNCTION pg_control_system() to slotwatch's role", "err", pgErr.Message)
	}
	c.conn, c.versionNum, c.version, c.systemID = conn, num, ver, sysID
	return nil
}

func (c *Collector) read(ctx context.Context, start time.Time) (*Snapshot, error) {
	s := &Snapshot{VersionNum: c.versionNum, Version: c.version, SystemID: c.systemID}
	q := queries(c.versionNum)

	s.Time = time.Now()
	rows, err := queryRows(ctx, c.conn, q.walPosition)
	if err != nil {
		return nil, fmt.Errorf("read current WAL position: %w", err)
	}
	if s.InRecovery, s.WALPosition, err = parseWALPosition(rows); err != nil {
		return nil, err
	}

	if rows, err = queryRows(ctx, c.conn, q.slots); err != nil {
		return nil, fmt.Errorf("query pg_replication_slots: %w", err)
	}
	if s.Slots, err = parseSlots(rows); err != nil {
		return nil, err
	}

	if rows, err = queryRows(ctx, c.conn, q.statReplication); err != nil {
		return nil, fmt.Errorf("query pg_stat_replication: %w", err)
	}
	if s.Senders, err = parseSenders(rows); err != nil {
		return nil, err
	}

	if q.statReplicationSlots != "" {
		if rows, err = queryRows(ctx, c.conn, q.statReplicationSlots); err != nil {
			return nil, fmt.Errorf("query pg_stat_replication_slots: %w", err)
		}
		if s.SlotStats, err = parseSlotStats(rows); err != nil {
			return nil, err
		}
	}

	if rows, err = queryRows(ctx, c.conn, q.settings); err != nil {
		return nil, fmt.Errorf("query pg_settings: %w", err)
	}
	if s.Settings, err = parseSettings(rows); err != nil {
		return nil, err
	}

	rows, err = queryRows(ctx, c.conn, q.walDir)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		if s.WALDir, err = parseWALDir(rows); err != nil {
			return nil, err
		}
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		// Allowed to fail: only superusers and pg_monitor may list pg_wal.
		if !c.walDirDenied {
			c.log.Info("WAL directory size not collected: grant pg_monitor to slotwatch's role to get slotwatch_wal_dir_bytes", "err", pgErr.Message)
			c.walDirDenied = true
		}
	default:
		return nil, fmt.Errorf("query pg_ls_waldir(): %w", err)
	}

	s.Duration = time.Since(start)
	return s, nil
}

// querySet is the SQL one server version gets.
type querySet struct {
	walPosition, slots, statReplication, statReplicationSlots, settings, walDir string
}

func queries(version int) querySet {
	return querySet{
		walPosition:          walPositionQuery,
		slots:                slotsQuery(version),
		statReplication:      statReplicationQuery,
		statReplicationSlots: statReplicationSlotsQuery(version),
		settings:             settingsQuery(version),
		walDir:               walDirQuery,
	}
}

// parseRecorded turns rows recorded from a server (view name to rows, in the text
// form the server sends) into a Snapshot as Collect would. It serves the
// golden tests of every version's queries.
func parseRecorded(versionNum int, rows map[string][]row) (*Snapshot, error) {
	s := &Snapshot{VersionNum: versionNum}
	var err error
	if s.InRecovery, s.WALPosition, err = parseWALPosition(rows["wal_position"]); err != nil {
		return nil, err
	}
	if s.Slots, err = parseSlots(rows["pg_replication_slots"]); err != nil {
		return nil, err
	}
	if s.Senders, err = parseSenders(rows["pg_stat_replication"]); err != nil {
		return nil, err
	}
	if r, ok := rows["pg_stat_replication_slots"]; ok {
		if s.SlotStats, err = parseSlotStats(r); err != nil {
			return nil, err
		}
	}
	if s.Settings, err = parseSettings(rows["pg_settings"]); err != nil {
		return nil, err
	}
	if r, ok := rows["pg_ls_waldir"]; ok {
		if s.WALDir, err = parseWALDir(r); err != nil {
			return nil, err
		}
	}
	return s, nil
}
