package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/relay/checkpoint"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/offsets"
	"github.com/pgoutbox/pgoutbox/relay/publish"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// exactlyOnce prepares the session's exactly-once position (transactional
// mode only; nil otherwise): the offsets topic made sure of, the history
// the positions belong to (st.OffsetsEpoch, issued here when the state row
// has none: a new slot, an accepted reset, a connector that ran without
// it), and the position read back from Kafka, checked against the state
// row and the server's timeline. It runs after InitProducerID fenced the
// previous producer, so no transaction of it is still open.
//
// The position decides what is new, not PostgreSQL's confirmed position,
// which may be far behind (persisted at checkpoints). It may be ahead of
// the state row's record of it (st.OffsetsLSN, written with the promise),
// never behind: behind, or missing while the state row says positions were
// committed, the offsets topic lost them (deleted, emptied, compacted by a
// wrong policy), and the start stops with the choices unless
// OUTBOX_ON_OFFSETS_LOSS=at-least-once.
func (r *Relay) exactlyOnce(ctx context.Context, kcl *kgo.Client, c *conns, sys pglogrepl.IdentifySystemResult, db string, st *checkpoint.State, token int64) (*publish.Offsets, error) {
	if !r.cfg.Transactional {
		return nil, nil
	}
	topic := r.cfg.OffsetsTopic
	if err := offsets.Ensure(ctx, kadm.NewClient(kcl), topic, r.cfg.TopicCreate, int16(r.cfg.TopicReplicationFactor)); err != nil {
		var me *offsets.MissingError
		var ne *offsets.NotCompactedError
		if errors.As(err, &me) {
			r.metrics.TopicMissing.WithLabelValues(topic).Set(1)
		}
		if errors.As(err, &me) || errors.As(err, &ne) {
			return nil, &fatal.Error{Msg: "the exactly-once offsets topic", Err: err}
		}
		if refused(err) {
			return nil, &fatal.Error{Msg: fmt.Sprintf("Kafka refused the connector the exactly-once offsets topic %q: grant it CREATE (or create the topic: one partition, cleanup.policy=compact), DESCRIBE_CONFIGS, READ and WRITE on it, or set OUTBOX_KAFKA_OFFSETS_TOPIC to a topic it may use", topic), Err: err}
		}
		return nil, &kafkaError{err}
	}
	// It exists (again): a session that found it deleted left its alarm
	// on (see publish's offsetsGone) for this start to end. What its
	// positions say is checked below.
	r.metrics.TopicMissing.DeleteLabelValues(topic)
	o := &publish.Offsets{
		Topic: topic,
		Key:   offsets.Key{SystemID: sys.SystemID, Database: db, Slot: r.cfg.Slot},
		Base:  offsets.Position{Epoch: st.OffsetsEpoch, Timeline: sys.Timeline, Token: token},
	}
	newHistory := func(why string) error {
		st.OffsetsEpoch = newEpoch()
		st.OffsetsLSN = 0
		o.Base.Epoch = st.OffsetsEpoch
		if err := checkpoint.SaveState(ctx, c.conn, *st, checkpoint.Fence{Token: token}); err != nil {
			return err
		}
		r.log.Info("exactly-once positions start a new history: nothing the slot gives is skipped until the first Kafka transaction commits one", "why", why, "epoch", st.OffsetsEpoch, "topic", topic)
		r.kafkaPos.Store(0)
		return nil
	}
	if st.OffsetsEpoch == 0 {
		return o, newHistory("the state row names no history (a new slot, an accepted slot reset, or a connector that ran without exactly-once)")
	}
	pos, found, err := offsets.Load(ctx, r.cfg.Kafka.Opts(nil), topic, o.Key)
	var ce *offsets.CorruptError
	if errors.As(err, &ce) {
		return nil, &fatal.Error{Msg: "the exactly-once offsets topic", Err: err}
	}
	if err != nil {
		if refused(err) {
			return nil, &fatal.Error{Msg: fmt.Sprintf("Kafka refused the connector the exactly-once offsets topic %q: grant it READ and WRITE on it, or set OUTBOX_KAFKA_OFFSETS_TOPIC to a topic it may use", topic), Err: err}
		}
		return nil, &kafkaError{err}
	}
	lost := ""
	switch {
	case found && pos.Epoch == st.OffsetsEpoch && pos.Timeline == sys.Timeline && pos.Commit > uint64(sys.XLogPos):
		// The server's WAL ends before the position: it was restored from
		// a copy (onto the same timeline) and writes again where Kafka
		// holds other events; skipping up to the position would skip the
		// new ones.
		lost = fmt.Sprintf("its position %s is beyond this server's WAL end %s (a server restored from a copy of itself, on the same timeline?)", pos, wal.FormatLSN(uint64(sys.XLogPos)))
	case found && pos.Epoch == st.OffsetsEpoch && pos.Commit < st.OffsetsLSN:
		lost = fmt.Sprintf("the newest position in it is %s, behind the %s the state row recorded as committed", pos, wal.FormatLSN(st.OffsetsLSN))
	case found && pos.Epoch == st.OffsetsEpoch:
	case st.OffsetsLSN != 0 && found:
		lost = fmt.Sprintf("its newest position for the slot, %s, is of another history than the state row's (epoch %d, committed up to %s)", pos, st.OffsetsEpoch, wal.FormatLSN(st.OffsetsLSN))
	case st.OffsetsLSN != 0:
		lost = fmt.Sprintf("it holds no position for the slot, though the state row recorded one committed at %s (epoch %d)", wal.FormatLSN(st.OffsetsLSN), st.OffsetsEpoch)
	case found:
		// An older history's position (the slot was made again since, and
		// no Kafka transaction of the new history committed yet).
		r.log.Info("the offsets topic's position for the slot is of an earlier history; ignoring it", "position", pos.String(), "epoch", st.OffsetsEpoch)
		return o, nil
	default:
		// Nothing says whether a Kafka transaction of this history ever
		// committed: none did yet (a crash before the first one), or the
		// topic lost them before the state row recorded one (it records
		// them at most a status interval late). Said, not silent.
		r.log.Warn("the offsets topic holds no position for the slot's exactly-once history, and the state row recorded none: either no Kafka transaction of it committed yet, or the topic lost them (deleted or emptied within a few seconds of the first); what the slot replays is published, again if it was before",
			"topic", topic, "epoch", st.OffsetsEpoch, "confirmed", wal.FormatLSN(st.Confirmed))
		return o, nil
	}
	if lost == "" && pos.Timeline != sys.Timeline {
		at, why, err := r.sameHistory(ctx, c, pos, sys.Timeline)
		if err != nil {
			return nil, err
		}
		if why != "" {
			lost = why
		} else if at.Less(pos) {
			r.log.Warn("the exactly-once position is past the point where this server's timeline forked from the one it was written on (a promotion): events after the fork are another history, and only those before it are skipped",
				"position", pos.String(), "fork", wal.FormatLSN(at.Commit), "timeline", sys.Timeline)
			pos.Commit, pos.Events = at.Commit, at.Events
		}
	}
	if lost != "" {
		msg := fmt.Sprintf("the exactly-once offsets topic %q lost the connector's position for slot %q: %s. Someone deleted or emptied the topic, or it was restored from an older copy. "+
			"Either restore the topic's records, or start once with OUTBOX_ON_OFFSETS_LOSS=at-least-once to continue from the slot's position %s, publishing again what the slot replays (duplicates, never losses), or keep it stopped",
			topic, r.cfg.Slot, lost, wal.FormatLSN(st.Confirmed))
		if r.cfg.OnOffsetsLoss != "at-least-once" {
			return nil, fatal.Errorf("%s", msg)
		}
		r.log.Warn(msg, "on_offsets_loss", r.cfg.OnOffsetsLoss)
		return o, newHistory("OUTBOX_ON_OFFSETS_LOSS=at-least-once after the offsets topic lost the position")
	}
	r.kafkaPos.Store(pos.Commit)
	r.log.Info("exactly-once position read back: the events it covers are in Kafka and are skipped when the slot gives them again", "position", pos.String(), "confirmed", wal.FormatLSN(st.Confirmed))
	o.Resume = &pos
	return o, nil
}

// refused reports whether Kafka refused the request for the connector's
// rights or the cluster's policy: no retry changes that (the event topics'
// refusals are fatal too), so it stops the connector with what to grant.
func refused(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, kerr.PolicyViolation)
}

// sameHistory finds where the history of the position's timeline and this
// server's (timeline) part: the position, clamped to that fork. why is not
// empty when the position is of no ancestor of this server's timeline.
func (r *Relay) sameHistory(ctx context.Context, c *conns, pos offsets.Position, timeline int32) (offsets.Position, string, error) {
	if pos.Timeline > timeline {
		return pos, fmt.Sprintf("its position %s was written on timeline %d, newer than this server's %d (a server restored from an older backup?)", pos, pos.Timeline, timeline), nil
	}
	h, err := pglogrepl.TimelineHistory(ctx, c.rconn, timeline)
	if err != nil {
		return pos, "", fmt.Errorf("read the history of timeline %d: %w", timeline, err)
	}
	fork, ok, err := forkPoint(h.Content, pos.Timeline)
	if err != nil {
		return pos, "", err
	}
	if !ok {
		return pos, fmt.Sprintf("its position %s was written on timeline %d, which is not in the history of this server's timeline %d", pos, pos.Timeline, timeline), nil
	}
	if pos.Commit < fork {
		return pos, "", nil
	}
	return offsets.Position{Commit: fork}, "", nil
}

// forkPoint reads a timeline history file (lines "timeline<TAB>switch
// point<TAB>reason") for where timeline tli ended.
func forkPoint(content []byte, tli int32) (uint64, bool, error) {
	for _, line := range strings.Split(string(content), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil || int32(n) != tli {
			continue
		}
		lsn, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return 0, false, fmt.Errorf("timeline history line %q: %w", line, err)
		}
		return uint64(lsn), true, nil
	}
	return 0, false, nil
}

// newEpoch names a new history of exactly-once positions.
func newEpoch() int64 { return rand.Int64N(1<<62) + 1 }
