package alert

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
)

// WebhookMessage is Alertmanager's webhook payload (version 4), which any
// Alertmanager-compatible receiver takes.
type WebhookMessage struct {
	Version           string            `json:"version"`
	GroupKey          string            `json:"groupKey"`
	TruncatedAlerts   int               `json:"truncatedAlerts"`
	Status            string            `json:"status"`
	Receiver          string            `json:"receiver"`
	GroupLabels       map[string]string `json:"groupLabels"`
	CommonLabels      map[string]string `json:"commonLabels"`
	CommonAnnotations map[string]string `json:"commonAnnotations"`
	ExternalURL       string            `json:"externalURL"`
	Alerts            []Alert           `json:"alerts"`
}

type webhookSink struct {
	url         string
	client      *http.Client
	externalURL string
}

// send posts one message per alert instance: each is its own group, keyed
// by its labels, so a receiver can follow every instance from firing to
// resolved.
func (s *webhookSink) send(ctx context.Context, alerts []Alert) error {
	for _, a := range alerts {
		if err := postJSON(ctx, s.client, s.url, newWebhookMessage(a, s.externalURL)); err != nil {
			return err
		}
	}
	return nil
}

func newWebhookMessage(a Alert, externalURL string) WebhookMessage {
	if a.Status == "firing" {
		// Alertmanager shows a firing alert's endsAt as the zero time.
		a.EndsAt = time.Time{}
	}
	return WebhookMessage{
		Version:           "4",
		GroupKey:          "{}:" + labelString(a.Labels),
		Status:            a.Status,
		Receiver:          "slotwatch",
		GroupLabels:       copyMap(a.Labels),
		CommonLabels:      copyMap(a.Labels),
		CommonAnnotations: copyMap(a.Annotations),
		ExternalURL:       externalURL,
		Alerts:            []Alert{a},
	}
}

// labelString renders labels as {a="1", b="2"}, sorted, as Alertmanager
// renders group keys.
func labelString(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%q", k, l[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
