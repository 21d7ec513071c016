package wal

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// TestMissingPublicationTranslated (review 3, finding 1): lc_messages is
// the server's, so the messages that say the publication is missing may be
// translated, with other quotes. A 42704 during streaming (13 to 17: only
// pgoutput's publication lookup raises it there; a missing slot fails
// START_REPLICATION) stops the stream with the missing-publication
// fatal.Error whatever its text, and so does 18's warning that it skipped
// the publication, by its code (55000, or 42704) or by the bare name; a
// warning with neither, and a notice below WARNING, do not stop it.
func TestMissingPublicationTranslated(t *testing.T) {
	wantMissing := func(t *testing.T, err error) {
		t.Helper()
		var fe *fatal.Error
		if !errors.As(err, &fe) {
			t.Fatalf("got %v; want the missing-publication fatal.Error", err)
		}
		for _, want := range []string{`publication "outbox_pub" does not exist`, `"outbox_slot"`, "OUTBOX_ACCEPT_SLOT_RESET=true"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}

	t.Run("stream error", func(t *testing.T) {
		for lang, msg := range map[string]string{
			"en": `publication "outbox_pub" does not exist`,
			"de": `Publikation »outbox_pub« existiert nicht`,
			"fr": `la publication « outbox_pub » n'existe pas`,
		} {
			t.Run(lang, func(t *testing.T) {
				g := newGuardStream(t, 500, nil, nil)
				err := g.classifyStream(&pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "42704", Message: msg})
				wantMissing(t, err)
			})
		}
		g := newGuardStream(t, 500, nil, nil)
		if err := g.classifyStream(&pgconn.PgError{Code: "08006", Message: "Verbindung verloren"}); fatal.Is(err) {
			t.Errorf("a connection failure is fatal: %v", err)
		}
	})

	t.Run("warning", func(t *testing.T) {
		for name, m := range map[string]*pgproto3.NoticeResponse{
			"en":            {Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "55000", Message: `skipped loading publication "outbox_pub"`},
			"de":            {Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "55000", Message: `Laden der Publikation »outbox_pub« übersprungen`},
			"fr":            {Severity: "ATTENTION", SeverityUnlocalized: "WARNING", Code: "55000", Message: `chargement de la publication « outbox_pub » ignoré`},
			"code 42704":    {Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "42704", Message: `Publikation übersprungen`},
			"code 55000":    {Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "55000", Message: `Publikation übersprungen`},
			"name, no code": {Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Message: `Publikation outbox_pub übersprungen`},
		} {
			t.Run(name, func(t *testing.T) {
				g := newGuardStream(t, 500, nil, nil)
				wantMissing(t, g.notice(m))
			})
		}
		for name, m := range map[string]*pgproto3.NoticeResponse{
			"another warning": {Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "01000", Message: `etwas anderes`},
			"a notice":        {Severity: "HINWEIS", SeverityUnlocalized: "NOTICE", Code: "00000", Message: `outbox_pub`},
			// PostgreSQL 17's walsender waiting for a standby: 55000 too.
			"standby inactive": {Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "55000",
				Message: `Replikations-Slot »standby1«, der im Parameter »synchronized_standby_slots« angegeben ist, hat keine active_pid`},
			"standby missing": {Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "22023",
				Message: `replication slot "standby1" specified in parameter "synchronized_standby_slots" does not exist`},
			// A standby's slot named after the publication.
			"standby named like it": {Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "55000",
				Message: `replication slot "outbox_pub_standby" specified in parameter "synchronized_standby_slots" does not have active_pid`},
		} {
			t.Run(name, func(t *testing.T) {
				g := newGuardStream(t, 500, nil, nil)
				if err := g.notice(m); err != nil {
					t.Errorf("%s stopped the stream: %v", name, err)
				}
			})
		}
	})
}
