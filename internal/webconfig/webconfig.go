// Package webconfig serves a binary's HTTP endpoints (/metrics, health, the
// status page) the way Prometheus exporters do: a web configuration file in
// the Prometheus exporter-toolkit format turns on TLS (tls_server_config)
// and basic authentication with bcrypt-hashed passwords (basic_auth_users).
// The file is read, and served, by github.com/prometheus/exporter-toolkit/web
// itself, so its format, its reload behaviour (users on every request,
// certificates on every new connection) and its security headers are the
// ones operators already know from node_exporter or postgres_exporter.
//
// Basic authentication, when set, covers every path the server answers,
// health checks included: the exporter toolkit has no unauthenticated paths,
// and a probe can send the Authorization header like a scraper does.
package webconfig

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/exporter-toolkit/web"
	"gopkg.in/yaml.v3"
)

// Off is the listen address that turns the HTTP endpoint off. An empty value
// cannot mean off, because an empty environment variable means "use the
// default".
const Off = "off"

// file is the part of the exporter toolkit's file this package looks into
// (to log what is on and to know the scheme); the toolkit reads the rest.
type file struct {
	TLS struct {
		Cert     string `yaml:"cert"`
		CertFile string `yaml:"cert_file"`
	} `yaml:"tls_server_config"`
	Users map[string]string `yaml:"basic_auth_users"`
}

// Check validates the web configuration file at path, certificates and
// password hashes included, and returns one line naming the setting (env)
// when it cannot be used, so that a bad file refuses start instead of
// serving unprotected or failing at the first scrape. An empty path is
// valid: plain HTTP, no authentication.
func Check(env, path string) error {
	if path == "" {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%s: cannot read the web config %q: %w", env, path, unwrapPath(err))
	}
	if err := web.Validate(path); err != nil {
		msg := oneLine(err.Error())
		if strings.Contains(msg, "bcrypt") {
			// The usual mistake: a password written in clear.
			msg += "; basic_auth_users maps each user to a bcrypt hash of the password (htpasswd -nbBC 10 USER PASSWORD prints USER:HASH)"
		}
		return fmt.Errorf("%s: web config %q: %s", env, path, msg)
	}
	return nil
}

// Summary says what the (already checked) file at path turns on, for the
// start log line: TLS, and how many basic-auth users (never who).
func Summary(path string) (tls bool, users int) {
	f, err := read(path)
	if err != nil {
		return false, 0
	}
	return f.TLS.CertFile != "" || f.TLS.Cert != "", len(f.Users)
}

// Scheme is "https" when the file at path turns TLS on, else "http".
func Scheme(path string) string {
	if tls, _ := Summary(path); tls {
		return "https"
	}
	return "http"
}

func read(path string) (file, error) {
	var f file
	if path == "" {
		return f, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	// Not strict: the toolkit checks the whole file; only two keys matter here.
	err = yaml.Unmarshal(raw, &f)
	return f, err
}

// Serve serves srv on ln until srv is shut down, with TLS and basic
// authentication as the file at path (env's value) says; an empty path serves
// plain HTTP. It returns nil after srv.Shutdown or srv.Close.
func Serve(ln net.Listener, srv *http.Server, env, path string, log *slog.Logger) error {
	if tls, users := Summary(path); users > 0 && !tls {
		log.Warn("basic authentication without TLS: passwords cross the network in clear text; add tls_server_config to the web config", "setting", env)
	}
	if srv.ErrorLog == nil {
		// TLS handshake failures (a scraper using http://, an untrusted
		// certificate) are the server's to report, in the binary's log format.
		srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	}
	err := web.Serve(ln, srv, &web.FlagConfig{WebConfigFile: &path}, log)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve HTTP on %s: %w", ln.Addr(), err)
	}
	return nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
