// Package probe is the `probe URL` subcommand the binaries share, so that a
// container healthcheck works in an image with no shell or curl.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Run GETs rawURL and returns an error unless it answers 200 within 3 s.
// Basic-auth credentials go in the URL (https://user:password@host/readyz);
// errors show the URL with the password masked. A private CA for https is
// taken from SSL_CERT_FILE, as Go reads it for the system roots.
func Run(ctx context.Context, rawURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	u, err := url.Parse(rawURL)
	if err != nil {
		return errors.New("probe: the URL does not parse")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", u.Redacted(), err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// *url.Error masks the password itself.
		return fmt.Errorf("probe: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s: %s", u.Redacted(), resp.Status)
	}
	return nil
}
