package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/cli"
)

// TestCommandLine: -help lists the subcommands and the required settings;
// each subcommand's -help shows its own flags; an unknown word, or a word
// after the flags, exits 2 with the list of subcommands, before anything
// connects.
func TestCommandLine(t *testing.T) {
	getenv := func(string) string { return "" }
	names := []string{"run", "recover", "backfill", "redrive", "probe"}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"help", []string{"-help"}, 0, append([]string{"Usage: connector run",
			"Required: -kafka-brokers (OUTBOX_KAFKA_BROKERS), -pg-dsn (OUTBOX_PG_DSN)",
			"required: PostgreSQL connection string", "-slot string"}, names...)},
		{"run help", []string{"run", "-h"}, 0, []string{"Usage: connector run", "Required: -kafka-brokers"}},
		{"backfill help", []string{"backfill", "-help"}, 0, []string{"Usage: connector backfill -from TIME", "-from string", "-batch int"}},
		{"redrive help", []string{"redrive", "-help"}, 0, []string{"Usage: connector redrive", "-group string"}},
		{"recover help", []string{"recover", "-help"}, 0, []string{"Usage: connector recover", "-allow-gap"}},
		{"unknown command", []string{"start"}, 2, append([]string{`connector: unknown command "start"; the commands are:`}, names...)},
		{"word after the flags", []string{"-slot", "s", "start"}, 2, append([]string{`connector: unexpected "start" after the flags of run`}, names...)},
		{"probe without URL", []string{"probe"}, 2, []string{"connector: probe takes one URL"}},
		{"unknown flag", []string{"redrive", "-nosuch"}, 2, []string{"flag provided but not defined: -nosuch"}},
		{"missing settings", []string{"run"}, 1, []string{"OUTBOX_PG_DSN: missing", "OUTBOX_KAFKA_BROKERS: missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cli.Exit(context.Background(), "connector", nil, &stderr, nil, func(ctx context.Context) error {
				return run(ctx, tc.args, getenv, &stdout, &stderr)
			})
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}
