package inbox

import (
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// RedriveHeader is the header that redrives a dead letter. The inbox puts
// it, with the record's id as its value, on every dead letter whose id it
// marked dead-lettered. A record arriving with it, whose id this consumer
// group has marked dead-lettered, is applied once more: the mark is taken
// back in the handler's transaction, so it commits with the handler's work,
// and a second copy of the redrive is a duplicate. Without the header, or
// for an id that is processed (not dead-lettered), a record is deduplicated
// as usual.
//
// A redrive applies only in the group that dead-lettered it, named by the
// dead letter's header inbox.consumer (ConsumerHeader), which the redrive
// keeps: the source topic is read by every group, and another group that
// dead-lettered the same id (for its own reason) takes the record as a
// duplicate, its dead letter left for its own operator to redrive. A redrive
// without inbox.consumer (removed on purpose) applies in every group that
// has the id dead-lettered.
//
// To redrive, publish the DLQ record to its source topic: unchanged (key,
// value, headers; kcat or any tool that copies records will do), or as
// Redrive builds it. With the default partitioner the key puts it in its
// aggregate's partition again, after the aggregate's later events: a redrive
// is applied out of order (see the package doc). A dead letter written
// before this header existed has none: RedriveID builds its redrive, or add
// the header by hand (kcat -H inbox.redrive=<id>) when republishing it.
const RedriveHeader = "inbox.redrive"

// ConsumerHeader names the consumer group on a dead letter, and so the group
// a redrive of it applies in (see RedriveHeader).
const ConsumerHeader = "inbox.consumer"

// redriveFor reports whether rec redrives id in group: it carries
// RedriveHeader for id, and ConsumerHeader names group or is absent.
func redriveFor(rec *kgo.Record, id, group string) bool {
	if Header(rec, RedriveHeader) != id {
		return false
	}
	g := Header(rec, ConsumerHeader)
	return g == "" || g == group
}

// ownHeaders returns hs without the inbox's own headers (prefix "inbox."),
// which describe an earlier dead letter of the record, if any.
func ownHeaders(hs []kgo.RecordHeader) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, 0, len(hs)+7)
	for _, h := range hs {
		if !strings.HasPrefix(h.Key, "inbox.") {
			out = append(out, h)
		}
	}
	return out
}

// Redrive returns the record that redrives the dead letter dl, read from the
// DLQ topic: its key and value, its original headers, RedriveHeader and the
// group that dead-lettered it (ConsumerHeader), for the topic it came from
// (header inbox.source.topic). Produce it with any client. It refuses a dead
// letter the inbox did not mark (no id header, an id the table cannot hold,
// an id another payload holds: the inbox would dead-letter it again), and
// one written before RedriveHeader existed, which RedriveID takes.
func Redrive(dl *kgo.Record) (*kgo.Record, error) {
	topic, id := Header(dl, "inbox.source.topic"), Header(dl, RedriveHeader)
	switch {
	case topic == "":
		return nil, errors.New("inbox: redrive: the record has no inbox.source.topic header: not an inbox dead letter")
	case id == "" && validateID(Header(dl, "id")) == nil:
		return nil, fmt.Errorf("inbox: redrive: the dead letter of id %q from %s has no %s header: written before it existed, "+
			"or the id was not marked (reason: %s); if the inbox marked it dead-lettered, redrive it with RedriveID(dl, %q)",
			Header(dl, "id"), topic, RedriveHeader, Header(dl, "inbox.error"), Header(dl, "id"))
	case id == "" || id != Header(dl, "id"):
		return nil, fmt.Errorf("inbox: redrive: the dead letter from %s cannot be redriven (reason: %s): the inbox did not mark its id",
			topic, Header(dl, "inbox.error"))
	}
	return redriveRecord(dl, topic, id), nil
}

// RedriveID returns the record that redrives the dead letter dl of event id,
// as Redrive does, for a dead letter without RedriveHeader: one written
// before the header existed, whose id the inbox marked dead-lettered then.
// id must be the dead letter's id header (a guard against redriving the
// wrong record). A redrive of an id that is not marked dead-lettered does
// no harm: the inbox deduplicates it as usual, or dead-letters it again.
func RedriveID(dl *kgo.Record, id string) (*kgo.Record, error) {
	topic := Header(dl, "inbox.source.topic")
	switch {
	case topic == "":
		return nil, errors.New("inbox: redrive: the record has no inbox.source.topic header: not an inbox dead letter")
	case id != Header(dl, "id"):
		return nil, fmt.Errorf("inbox: redrive: id %q is not the dead letter's (its id header is %q)", id, Header(dl, "id"))
	}
	if err := validateID(id); err != nil {
		return nil, fmt.Errorf("inbox: redrive: %w", err)
	}
	return redriveRecord(dl, topic, id), nil
}

func redriveRecord(dl *kgo.Record, topic, id string) *kgo.Record {
	headers := append(ownHeaders(dl.Headers), kgo.RecordHeader{Key: RedriveHeader, Value: []byte(id)})
	if g := Header(dl, ConsumerHeader); g != "" {
		headers = append(headers, kgo.RecordHeader{Key: ConsumerHeader, Value: []byte(g)})
	}
	return &kgo.Record{Topic: topic, Key: dl.Key, Value: dl.Value, Headers: headers}
}
