package collect

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// pg_settings: the settings that decide how much WAL a slot may hold, and
// those that decide whether a standby's copy of a failover slot is ready
// (hot_standby_feedback and primary_slot_name on the standby,
// synchronized_standby_slots on the primary). synchronized_standby_slots
// appeared in 17, idle_replication_slot_timeout in 18; the others are on 13
// to 18. Every role may read these (primary_conninfo, which may hold a
// password, is not among them).
const (
	settingsQuery13 = `SELECT name, setting, unit FROM pg_settings
WHERE name IN ('max_slot_wal_keep_size', 'wal_keep_size', 'max_wal_size', 'wal_segment_size',
               'hot_standby_feedback', 'primary_slot_name')
ORDER BY name`

	settingsQuery17 = `SELECT name, setting, unit FROM pg_settings
WHERE name IN ('max_slot_wal_keep_size', 'wal_keep_size', 'max_wal_size', 'wal_segment_size',
               'hot_standby_feedback', 'primary_slot_name', 'synchronized_standby_slots')
ORDER BY name`

	settingsQuery18 = `SELECT name, setting, unit FROM pg_settings
WHERE name IN ('max_slot_wal_keep_size', 'wal_keep_size', 'max_wal_size', 'wal_segment_size',
               'hot_standby_feedback', 'primary_slot_name', 'synchronized_standby_slots',
               'idle_replication_slot_timeout')
ORDER BY name`
)

func settingsQuery(version int) string {
	switch {
	case version >= 180000:
		return settingsQuery18
	case version >= 170000:
		return settingsQuery17
	}
	return settingsQuery13
}

// Settings are the server settings slotwatch reads, in bytes and seconds;
// nil when the server does not have the setting.
type Settings struct {
	// MaxSlotWALKeepSize is -1 when slots may retain unlimited WAL.
	MaxSlotWALKeepSize *int64 `json:"max_slot_wal_keep_size_bytes,omitempty"`
	WALKeepSize        *int64 `json:"wal_keep_size_bytes,omitempty"`
	MaxWALSize         *int64 `json:"max_wal_size_bytes,omitempty"`
	WALSegmentSize     *int64 `json:"wal_segment_size_bytes,omitempty"`
	// IdleReplicationSlotTimeout (18+) in seconds; 0 disables it.
	IdleReplicationSlotTimeout *float64 `json:"idle_replication_slot_timeout_seconds,omitempty"`
	// HotStandbyFeedback is hot_standby_feedback: on a standby, whether it
	// tells its primary which rows its queries and its slots still need.
	// A standby synchronizes failover slots only with it on.
	HotStandbyFeedback *bool `json:"hot_standby_feedback,omitempty"`
	// PrimarySlotName is primary_slot_name: on a standby, the physical slot
	// on its primary that it streams through ("" when none).
	PrimarySlotName *string `json:"primary_slot_name,omitempty"`
	// SynchronizedStandbySlots (17+) is synchronized_standby_slots, as slot
	// names: on a primary, the physical slots whose standbys must have
	// received a change before logical decoding of a failover slot hands it
	// out. Empty when unset.
	SynchronizedStandbySlots []string `json:"synchronized_standby_slots,omitempty"`
}

func parseSettings(rows []row) (Settings, error) {
	var s Settings
	for _, r := range rows {
		p := parser{r: r}
		name, setting, unit := p.str("name"), p.str("setting"), p.str("unit")
		switch name {
		case "hot_standby_feedback":
			// pg_settings shows a boolean as on or off.
			on := setting == "on"
			if !on && setting != "off" {
				return s, fmt.Errorf("pg_settings %s: %q is not on or off", name, setting)
			}
			s.HotStandbyFeedback = &on
			continue
		case "primary_slot_name":
			s.PrimarySlotName = &setting
			continue
		case "synchronized_standby_slots":
			s.SynchronizedStandbySlots = slotNames(setting)
			continue
		}
		v, err := strconv.ParseFloat(setting, 64)
		if err != nil {
			return s, fmt.Errorf("pg_settings %s: %q is not a number", name, setting)
		}
		scaled, kind, err := applyUnit(v, unit)
		if err != nil {
			return s, fmt.Errorf("pg_settings %s: %w", name, err)
		}
		switch name {
		case "max_slot_wal_keep_size":
			s.MaxSlotWALKeepSize = bytesSetting(v, scaled, kind)
		case "wal_keep_size":
			s.WALKeepSize = bytesSetting(v, scaled, kind)
		case "max_wal_size":
			s.MaxWALSize = bytesSetting(v, scaled, kind)
		case "wal_segment_size":
			s.WALSegmentSize = bytesSetting(v, scaled, kind)
		case "idle_replication_slot_timeout":
			if kind == "time" {
				s.IdleReplicationSlotTimeout = &scaled
			}
		}
	}
	return s, nil
}

// slotNames splits a list of slot names (synchronized_standby_slots) as
// PostgreSQL's SplitIdentifierString does: names separated by commas, with
// white space around them; a double-quoted name as written ("" for a quote),
// any other in lower case.
func slotNames(list string) []string {
	var names []string
	rest := strings.TrimLeft(list, " \t\n\r")
	for rest != "" {
		var name string
		if rest[0] == '"' {
			var b strings.Builder
			i := 1
			for ; i < len(rest); i++ {
				if rest[i] == '"' {
					if i+1 < len(rest) && rest[i+1] == '"' {
						b.WriteByte('"')
						i++
						continue
					}
					break
				}
				b.WriteByte(rest[i])
			}
			name, rest = b.String(), rest[min(i+1, len(rest)):]
		} else {
			end := strings.IndexByte(rest, ',')
			if end < 0 {
				end = len(rest)
			}
			name, rest = strings.ToLower(strings.TrimRight(rest[:end], " \t\n\r")), rest[end:]
		}
		if name != "" {
			names = append(names, name)
		}
		rest = strings.TrimLeft(rest, " \t\n\r")
		rest = strings.TrimLeft(strings.TrimPrefix(rest, ","), " \t\n\r")
	}
	return names
}

func bytesSetting(raw, scaled float64, kind string) *int64 {
	if kind != "bytes" && kind != "" {
		return nil
	}
	// -1 means "no limit" and is never scaled by the unit.
	if raw < 0 {
		n := int64(-1)
		return &n
	}
	n := int64(scaled)
	return &n
}

// applyUnit scales a pg_settings value by its unit ("MB", "8kB", "16MB",
// "s", "min", ...) to bytes or seconds.
func applyUnit(v float64, unit string) (float64, string, error) {
	if unit == "" {
		return v, "", nil
	}
	i := 0
	for i < len(unit) && unit[i] >= '0' && unit[i] <= '9' {
		i++
	}
	mult := 1.0
	if i > 0 {
		m, err := strconv.Atoi(unit[:i])
		if err != nil {
			return 0, "", fmt.Errorf("unit %q", unit)
		}
		mult = float64(m)
	}
	base := strings.TrimSpace(unit[i:])
	sizes := map[string]float64{"B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
	times := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}
	if f, ok := sizes[base]; ok {
		return v * mult * f, "bytes", nil
	}
	if d, ok := times[base]; ok {
		return v * mult * d.Seconds(), "time", nil
	}
	return 0, "", fmt.Errorf("unknown unit %q", unit)
}
