// Package probe is the `probe URL` subcommand the binaries share, so that a
// container healthcheck works in an image with no shell or curl.
package probe

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// Run GETs url and returns an error unless it answers 200 within 3 s.
func Run(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s: %s", url, resp.Status)
	}
	return nil
}
