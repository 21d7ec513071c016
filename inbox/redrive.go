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
// To redrive, publish the DLQ record to its source topic: unchanged (key,
// value, headers; kcat or any tool that copies records will do), or as
// Redrive builds it. With the default partitioner the key puts it in its
// aggregate's partition again, after the aggregate's later events: a redrive
// is applied out of order (see the package doc).
const RedriveHeader = "inbox.redrive"

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
// DLQ topic: its key and value, its original headers and RedriveHeader, for
// the topic it came from (header inbox.source.topic). Produce it with any
// client. It refuses a dead letter the inbox did not mark (no id header, an
// id the table cannot hold, an id another payload holds): the inbox would
// dead-letter it again.
func Redrive(dl *kgo.Record) (*kgo.Record, error) {
	topic, id := Header(dl, "inbox.source.topic"), Header(dl, RedriveHeader)
	switch {
	case topic == "":
		return nil, errors.New("inbox: redrive: the record has no inbox.source.topic header: not an inbox dead letter")
	case id == "" || id != Header(dl, "id"):
		return nil, fmt.Errorf("inbox: redrive: the dead letter from %s cannot be redriven (reason: %s): the inbox did not mark its id",
			topic, Header(dl, "inbox.error"))
	}
	return &kgo.Record{Topic: topic, Key: dl.Key, Value: dl.Value,
		Headers: append(ownHeaders(dl.Headers), kgo.RecordHeader{Key: RedriveHeader, Value: []byte(id)})}, nil
}
