// Package config binds settings to flags and environment variables at once:
// every setting is a flag, and its environment variable supplies the default
// the flag overrides. Malformed environment values are collected and reported
// by Err, naming the variable and what it expects.
package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Binder binds flags to environment variables.
type Binder struct {
	fs     *flag.FlagSet
	getenv func(string) string
	envs   []string
	errs   []error
}

// NewBinder returns a binder on fs reading the environment through getenv.
func NewBinder(fs *flag.FlagSet, getenv func(string) string) *Binder {
	if getenv == nil {
		getenv = os.Getenv
	}
	return &Binder{fs: fs, getenv: getenv}
}

// EnvVars lists the environment variables bound so far, sorted.
func (b *Binder) EnvVars() []string {
	out := append([]string(nil), b.envs...)
	sort.Strings(out)
	return out
}

// Err reports every malformed environment value.
func (b *Binder) Err() error { return errors.Join(b.errs...) }

func (b *Binder) env(name string) (string, bool) {
	b.envs = append(b.envs, name)
	v := b.getenv(name)
	if v == "" {
		// NAME_FILE reads a secret (or any value) from a file, as container
		// platforms mount them.
		if f := b.getenv(name + "_FILE"); f != "" {
			raw, err := os.ReadFile(f)
			if err != nil {
				b.errs = append(b.errs, fmt.Errorf("%s_FILE: cannot read %q: %w", name, f, err))
				return "", false
			}
			return strings.TrimRight(string(raw), "\r\n"), true
		}
		return "", false
	}
	return v, true
}

func usage(u, env string) string { return fmt.Sprintf("%s (env %s)", u, env) }

// String binds a string setting.
func (b *Binder) String(p *string, flagName, env, def, help string) {
	if v, ok := b.env(env); ok {
		def = v
	}
	b.fs.StringVar(p, flagName, def, usage(help, env))
}

// Secret binds a string setting whose value must never be printed; the flag's
// default shown by -help is masked.
func (b *Binder) Secret(p *string, flagName, env, help string) {
	v, _ := b.env(env)
	*p = v
	b.fs.Func(flagName, usage(help+" (secret; prefer the environment or "+env+"_FILE)", env), func(s string) error {
		*p = s
		return nil
	})
}

// Duration binds a duration setting (Go syntax: 10s, 1m30s).
func (b *Binder) Duration(p *time.Duration, flagName, env string, def time.Duration, help string) {
	if v, ok := b.env(env); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: %q is not a duration; use Go syntax such as 10s or 1m30s", env, v))
		} else {
			def = d
		}
	}
	b.fs.DurationVar(p, flagName, def, usage(help, env))
}

// Int binds an integer setting.
func (b *Binder) Int(p *int, flagName, env string, def int, help string) {
	if v, ok := b.env(env); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: %q is not an integer", env, v))
		} else {
			def = n
		}
	}
	b.fs.IntVar(p, flagName, def, usage(help, env))
}

// Int64 binds a 64-bit integer setting (sizes in bytes).
func (b *Binder) Int64(p *int64, flagName, env string, def int64, help string) {
	if v, ok := b.env(env); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: %q is not an integer (sizes are in bytes)", env, v))
		} else {
			def = n
		}
	}
	b.fs.Int64Var(p, flagName, def, usage(help, env))
}

// Bool binds a boolean setting (true/false/1/0).
func (b *Binder) Bool(p *bool, flagName, env string, def bool, help string) {
	if v, ok := b.env(env); ok {
		x, err := strconv.ParseBool(v)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: %q is not a boolean; use true or false", env, v))
		} else {
			def = x
		}
	}
	b.fs.BoolVar(p, flagName, def, usage(help, env))
}

// CheckUnknownEnv returns an error for every environment variable that starts
// with one of prefixes but is not among known (nor a known name + "_FILE"):
// a typo in a setting must not be silently ignored.
func CheckUnknownEnv(environ []string, prefixes []string, known []string) error {
	set := make(map[string]bool, len(known)*2)
	for _, k := range known {
		set[k] = true
		set[k+"_FILE"] = true
	}
	var errs []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) && !set[name] {
				errs = append(errs, fmt.Errorf("%s: unknown setting; see -help for the settings this binary reads", name))
			}
		}
	}
	return errors.Join(errs...)
}
