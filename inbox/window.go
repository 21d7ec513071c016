package inbox

import (
	"fmt"
	"log/slog"
	"time"
)

// DefaultRetention is how long processed ids are kept when
// Config.Retention is zero: 20 days, longer than DefaultWindow's bound of
// 19 days (the window of a deployment on this project's and Kafka's
// defaults).
const DefaultRetention = 20 * 24 * time.Hour

// Window is how late a duplicate of an event can arrive after the event was
// first processed, by its sources:
//
//   - The connector's initial snapshot republishes every row the outbox
//     table holds whenever a slot is created (the first start, a lost slot
//     recreated, a failover to a server without the slot): a row written
//     OutboxRows ago is published again now.
//   - With the outbox-router instead of the connector: a router whose group
//     lost its offsets (the same causes as below) reads Debezium's change
//     topic again from its oldest record and republishes every event it
//     holds: up to that topic's retention.ms plus segment.ms later
//     (RouterSourceRetention, RouterSourceSegment).
//   - A consumer whose offsets are lost (expired after
//     offsets.retention.minutes of an empty group, reset by hand, a new
//     partition assignment with no committed offset) starts again from the
//     oldest record its topic holds: Kafka deletes a record only with its
//     whole segment, once the segment's newest record is older than
//     retention.ms, and a segment is closed only after segment.ms (and only
//     when a record arrives after that). A copy republished by a snapshot
//     is itself that old again.
//   - The relay repeats what it published since its last confirmed position
//     after a crash or a takeover, and the consumer may be behind: Lag.
//
// The sources add up: a row republished by a snapshot OutboxRows after it
// was written can be republished by a router that lost its offsets up to
// RouterSourceRetention + RouterSourceSegment later, read again after the
// consumer's own offset loss up to TopicRetention + TopicSegment after that,
// and handled Lag later still. An id must therefore be
// kept longer than Bound after its first processing, or that late copy is
// processed again.
//
// Not covered by any retention: a renamed consumer group (the group is the
// dedupe scope: the new name has processed nothing, and a reset to the start
// processes every record the topic holds again; copy the rows to the new
// name first), and a record still in a segment that never closed because no
// record arrived after segment.ms (a topic that went quiet): it outlives
// TopicRetention + TopicSegment. Reset offsets to a time inside the
// retention (kgo.NewOffset().AfterMilli), never to the start, once the
// group processed anything.
//
// Zero fields count as zero: a writer in ModeDeleteAfterInsert or
// ModeMessage leaves no rows for a snapshot to republish (OutboxRows 0).
type Window struct {
	// OutboxRows is the longest an event's row stays in the outbox table:
	// with daily partitions, maintain's retention (MAINTAIN_RETENTION, 72h)
	// plus the partition's own day plus the time between maintenance runs;
	// with outbox.Cleaner, its Retention (24h) plus the time between runs;
	// 0 in ModeDeleteAfterInsert and ModeMessage. DefaultWindow: 96h.
	OutboxRows time.Duration
	// RouterSourceRetention and RouterSourceSegment are retention.ms and
	// segment.ms of the Debezium change-event topic the outbox-router reads,
	// for events published through it; 0 (DefaultWindow) when the
	// connector publishes.
	RouterSourceRetention time.Duration
	RouterSourceSegment   time.Duration
	// TopicRetention is retention.ms of the consumed topics. DefaultWindow:
	// 7 days, Kafka's default, which the topics the connector creates get
	// unless OUTBOX_TOPIC_CONFIGS says otherwise.
	TopicRetention time.Duration
	// TopicSegment is segment.ms of the consumed topics (a record is
	// deleted only with its segment). DefaultWindow: 7 days, Kafka's
	// default; OUTBOX_TOPIC_CONFIGS=segment.ms=86400000 makes it a day.
	TopicSegment time.Duration
	// Lag is the longest relay outage plus consumer lag. DefaultWindow: 24h.
	Lag time.Duration
}

// DefaultWindow is the window of a deployment on the defaults: daily
// partitions kept 72h, topics with Kafka's retention.ms and segment.ms, a
// day of lag. Its Bound is 19 days; DefaultRetention exceeds it.
func DefaultWindow() Window {
	return Window{
		OutboxRows:     72*time.Hour + 24*time.Hour,
		TopicRetention: 7 * 24 * time.Hour,
		TopicSegment:   7 * 24 * time.Hour,
		Lag:            24 * time.Hour,
	}
}

// Bound is how late a duplicate can arrive after the first processing:
// OutboxRows + RouterSourceRetention + RouterSourceSegment + TopicRetention +
// TopicSegment + Lag.
func (w Window) Bound() time.Duration {
	return w.OutboxRows + w.RouterSourceRetention + w.RouterSourceSegment + w.TopicRetention + w.TopicSegment + w.Lag
}

// Validate returns an error when retention (Config.Retention; zero means
// DefaultRetention) does not exceed the window's Bound: a duplicate that
// late finds its id deleted and is processed again.
func (w Window) Validate(retention time.Duration) error {
	if retention <= 0 {
		retention = DefaultRetention
	}
	if retention > w.Bound() {
		return nil
	}
	return fmt.Errorf("inbox: Retention %s does not exceed the duplicate window of %s (outbox rows %s + the outbox-router's change topic "+
		"retention.ms %s + segment.ms %s + topic retention.ms %s + segment.ms %s + lag %s): "+
		"a duplicate arriving later is processed again; set Retention above %s, or shorten a source (a shorter outbox retention, "+
		"ModeDeleteAfterInsert, or a topic segment.ms of a day)",
		retention, w.Bound(), w.OutboxRows, w.RouterSourceRetention, w.RouterSourceSegment, w.TopicRetention, w.TopicSegment, w.Lag, w.Bound())
}

// retentionOrDefault is the Retention New uses: DefaultRetention for zero.
// With the deployment's own window (Config.Window) one that does not exceed
// it is refused: the deployment said how late its duplicates can be. Without
// it, one that does not exceed DefaultWindow's bound is kept (a deployment
// with shorter-lived topics or no outbox rows may be safe with it; it says
// so with Config.Window) but said aloud, because on the defaults it
// processes late duplicates again.
func retentionOrDefault(retention time.Duration, window *Window, log *slog.Logger) (time.Duration, error) {
	if retention <= 0 {
		retention = DefaultRetention
	}
	if window != nil {
		if err := window.Validate(retention); err != nil {
			return 0, fmt.Errorf("%w (the window stated in Config.Window)", err)
		}
		return retention, nil
	}
	if retention == DefaultRetention {
		return retention, nil
	}
	if err := DefaultWindow().Validate(retention); err != nil {
		if log == nil {
			log = slog.Default()
		}
		log.With("component", "inbox").Warn("inbox Retention is inside the duplicate window of a deployment on the defaults; "+
			"state your deployment's window in Config.Window (inbox.Window{...}) to check it against your outbox and topic settings",
			"retention", retention, "duplicate_window", DefaultWindow().Bound(), "err", err)
	}
	return retention, nil
}
