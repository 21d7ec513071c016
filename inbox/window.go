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
// was written can be read again after an offset loss up to TopicRetention +
// TopicSegment later, and handled Lag after that. An id must therefore be
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
// OutboxRows + TopicRetention + TopicSegment + Lag.
func (w Window) Bound() time.Duration {
	return w.OutboxRows + w.TopicRetention + w.TopicSegment + w.Lag
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
	return fmt.Errorf("inbox: Retention %s does not exceed the duplicate window of %s (outbox rows %s + topic retention.ms %s + segment.ms %s + lag %s): "+
		"a duplicate arriving later is processed again; set Retention above %s, or shorten a source (a shorter outbox retention, "+
		"ModeDeleteAfterInsert, or a topic segment.ms of a day)",
		retention, w.Bound(), w.OutboxRows, w.TopicRetention, w.TopicSegment, w.Lag, w.Bound())
}

// retentionOrDefault is the Retention New uses: DefaultRetention for zero.
// One that does not exceed DefaultWindow's bound is kept (a deployment with
// shorter-lived topics or no outbox rows may be safe with it: check it with
// Window.Validate and that deployment's figures) but said aloud, because on
// the defaults it processes late duplicates again.
func retentionOrDefault(retention time.Duration, log *slog.Logger) time.Duration {
	if retention <= 0 {
		return DefaultRetention
	}
	if err := DefaultWindow().Validate(retention); err != nil {
		if log == nil {
			log = slog.Default()
		}
		log.Warn("inbox Retention is inside the duplicate window of a deployment on the defaults; "+
			"check it with inbox.Window{...}.Validate and your outbox and topic settings",
			"component", "inbox", "retention", retention, "duplicate_window", DefaultWindow().Bound(), "err", err)
	}
	return retention
}
