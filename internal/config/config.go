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

// Required starts the help text of a setting that has no default and
// must be set; -help shows it, and a binary's usage may list them.
const Required = "required: "

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

// Var binds a setting of a type of its own: v parses the environment's value
// (or the file NAME_FILE names) first, a malformed one reported by Err, then
// the flag's. A secret's v must not print it (its String is -help's default).
func (b *Binder) Var(v flag.Value, flagName, env, help string) {
	if s, ok := b.env(env); ok {
		if err := v.Set(s); err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: %w", env, err))
		}
	}
	b.fs.Var(v, flagName, usage(help, env))
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

// Tooling lists the variables under the binaries' prefixes that belong to
// the project's scripts and tests, not to a binary: a developer's shell that
// exports them (make test, make up) must still start the binaries. A name
// ending in "_" stands for every name that starts with it.
var Tooling = []string{
	"OUTBOX_TEST_",             // the test suite's services (OUTBOX_TEST_KAFKA_BROKERS, ...)
	"OUTBOX_BENCH_",            // make bench
	"OUTBOX_SOAK",              // make soak
	"OUTBOX_SOAK_",             // make soak
	"OUTBOX_CACHE_DIR",         // scripts/: where Kafka, the registry and the stack live
	"OUTBOX_STACK_",            // scripts/stack.sh (make up)
	"OUTBOX_FENCING_",          // the fencing-cost test
	"OUTBOX_HA_LOGS",           // the HA test
	"SLOTWATCH_SCREENSHOT_DIR", // the status page screenshot test
}

// EnvRule says which environment variables belong to a binary.
type EnvRule struct {
	// Prefixes are the namespaces the binary owns (OUTBOX_, SLOTWATCH_).
	Prefixes []string
	// Others are namespaces inside Prefixes that another binary owns and
	// checks (OUTBOX_ROUTER_ for the connector), left to it.
	Others []string
	// Known are the settings the binary reads (through a Binder); NAME_FILE
	// of each is known too (the secret-file form).
	Known []string
}

// Reads reports whether the binary reads name: one of Known, or the
// NAME_FILE form of one. Deployment files are checked with it: a variable
// they set that the binary does not read is a mistake even outside the
// binary's namespaces, where CheckUnknownEnv lets it through.
func (r EnvRule) Reads(name string) bool {
	base, _ := strings.CutSuffix(name, "_FILE")
	for _, k := range r.Known {
		if name == k || base == k {
			return true
		}
	}
	return false
}

// CheckUnknownEnv refuses every variable of environ ("NAME=value") that is
// in one of the rule's namespaces but is neither a setting the binary reads
// (nor its _FILE form), another binary's, nor Tooling: a typo in a setting
// (OUTBOX_KAFKA_BROKER) must not be silently ignored while the binary runs
// on a default. Each refused name is one line, with the closest known
// setting when one is close enough to be the likely intent.
func CheckUnknownEnv(environ []string, rule EnvRule) error {
	set := make(map[string]bool, len(rule.Known)*2)
	for _, k := range rule.Known {
		set[k] = true
		set[k+"_FILE"] = true
	}
	var errs []error
	seen := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if seen[name] || set[name] || !hasPrefix(name, rule.Prefixes) || hasPrefix(name, rule.Others) || isTooling(name) {
			continue
		}
		seen[name] = true
		msg := name + ": unknown setting"
		if s := closest(name, rule.Known); s != "" {
			msg += "; did you mean " + s + "?"
		}
		errs = append(errs, errors.New(msg+" (-help lists the settings; unset it to start)"))
	}
	return errors.Join(errs...)
}

func hasPrefix(name string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func isTooling(name string) bool {
	for _, t := range Tooling {
		if name == t || (strings.HasSuffix(t, "_") && strings.HasPrefix(name, t)) {
			return true
		}
	}
	return false
}

// closest is the known setting nearest to name by edit distance, if it is
// near enough to be a typo: at most a third of the name's length past the
// shared prefix, and never more than 4 edits. NAME_FILE is matched as NAME.
func closest(name string, known []string) string {
	base, suffix := name, ""
	if b, ok := strings.CutSuffix(name, "_FILE"); ok {
		base, suffix = b, "_FILE"
	}
	best, bestD := "", 0
	for _, k := range known {
		d := distance(base, k)
		if best == "" || d < bestD || (d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	// Compare only the part after the shared prefix (OUTBOX_, SLOTWATCH_),
	// which every candidate has and which would make any name look close.
	rest := len(base) - commonPrefix(base, best)
	limit := min(4, max(1, rest/3+1))
	if bestD > limit {
		return ""
	}
	return best + suffix
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	// Back up to the last underscore: OUTBOX_KAFKA_ is shared, a letter is not.
	if i := strings.LastIndexByte(a[:n], '_'); i >= 0 {
		return i + 1
	}
	return 0
}

// distance is the Levenshtein distance between a and b (ASCII names).
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
