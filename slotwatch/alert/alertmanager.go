package alert

import (
	"context"
	"net/http"
	"time"
)

// postableAlert is an alert as Alertmanager's API v2 takes it
// (POST /api/v2/alerts).
type postableAlert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

type alertmanagerSink struct {
	url    string // …/api/v2/alerts
	client *http.Client
}

// send posts the batch. A firing alert carries the endsAt after which
// Alertmanager resolves it unless re-sent (the engine re-sends every
// Resend); a resolved one carries the time it resolved.
func (s *alertmanagerSink) send(ctx context.Context, alerts []Alert) error {
	body := make([]postableAlert, 0, len(alerts))
	for _, a := range alerts {
		end := a.EndsAt
		if a.Status == "firing" {
			end = a.validUntil
		}
		body = append(body, postableAlert{
			Labels:       a.Labels,
			Annotations:  a.Annotations,
			StartsAt:     a.StartsAt,
			EndsAt:       end,
			GeneratorURL: a.GeneratorURL,
		})
	}
	return postJSON(ctx, s.client, s.url, body)
}
