package wal

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// liveSetup adds, beside the outbox (sql/), what makes pgoutput send the
// message types the outbox alone never produces: a table whose column has a
// user-defined type (Type), that is updated, deleted and truncated, and whose
// text column is stored out of line without compression, so that an update
// leaves it as an unchanged TOAST value ('u').
var liveSetup = []string{
	`CREATE TYPE public.decode_mood AS ENUM ('sad', 'happy')`,
	`CREATE TABLE public.decode_other (id int PRIMARY KEY, mood public.decode_mood, note text)`,
	`ALTER TABLE public.decode_other ALTER COLUMN note SET STORAGE EXTERNAL`,
	`CREATE PUBLICATION pub FOR TABLE public.outbox, public.decode_other`,
	`SELECT pg_replication_origin_create('decode_origin')`,
	`SELECT pg_create_logical_replication_slot('decode', 'pgoutput')`,
}

// liveWrites are the transactions of the scenario, in order; each string is
// sent as one simple-protocol query. $BIG and $NOTE are replaced by
// liveBigHex and liveNote.
var liveWrites = []string{
	// T1: two outbox rows (unicode jsonb, NULL payload) and a transactional
	// outbox message.
	`BEGIN;
	INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES
	  ('` + liveRows[0].id + `', 'Order', 'order-1', 'OrderCreated',
	   '{"name": "Zoë", "city": "Kraków", "emoji": "\ud83c\udf89", "note": "日本語 \u00e9"}', '2026-11-30 08:00:00.123456+00');
	INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES
	  ('` + liveRows[1].id + `', 'Order', 'order-2', 'OrderCancelled', NULL, '2026-11-30 08:00:01+00');
	SELECT pg_logical_emit_message(true, 'outbox', '` + liveTxMessage + `');
	COMMIT`,
	// T2: a payload large and random enough to be stored out of line.
	`INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES
	  ('` + liveRows[2].id + `', 'Blob', 'blob-1', 'BlobStored', '{"blob": "$BIG"}', '2026-11-30 08:00:02+00')`,
	// T3: a non-transactional message, sent on its own.
	`SELECT pg_logical_emit_message(false, 'heartbeat', 'tick')`,
	// T4 to T7: insert, update (the note stays TOASTed), delete, truncate.
	`INSERT INTO public.decode_other VALUES (1, 'happy', '$NOTE')`,
	`UPDATE public.decode_other SET mood = 'sad' WHERE id = 1`,
	`DELETE FROM public.decode_other WHERE id = 1`,
	`TRUNCATE public.decode_other`,
	// T8: a transaction replayed from an origin: Origin follows Begin, and
	// the commit time is the origin's.
	`SELECT pg_replication_origin_session_setup('decode_origin');
	BEGIN;
	SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2026-11-30 08:00:00+00');
	INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES
	  ('` + liveRows[3].id + `', 'Order', 'order-4', 'OrderReplicated', '{}', '2026-11-30 08:00:03+00');
	COMMIT;
	SELECT pg_replication_origin_session_reset()`,
}

// livePeek reads the slot without consuming it, with the options the
// connector streams with: protocol version 1 and logical decoding messages.
const livePeek = `SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes('decode', NULL, NULL,
	'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')`

// TestDecodeLive writes the scenario into a throwaway PostgreSQL, reads the
// raw pgoutput bytes back from the slot and checks that every message
// decodes to what was written. With -update it rewrites the golden file
// (testdata/pgoutput_v1.golden) that TestDecodeGolden checks without a server.
func TestDecodeLive(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := pg.Conn(t, "outbox")
	var versionNum int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&versionNum); err != nil {
		t.Fatal(err)
	}
	if versionNum < 140000 {
		// Not a missing service: pgoutput's messages option came in 14.
		t.Skipf("PostgreSQL %s: pgoutput sends logical decoding messages from 14 on", pg.Version)
	}
	// pgoutput formats timestamptz in the decoding session's time zone.
	// The golden file holds the outbox's columns as Debezium's default
	// EventRouter table has them: without the optional trace column
	// sql/001_outbox.sql adds.
	setup := append([]string{"SET TimeZone = 'UTC'", "SET DateStyle = 'ISO, MDY'",
		"ALTER TABLE public.outbox DROP COLUMN tracingspancontext"}, liveSetup...)
	for _, q := range setup {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	start := time.Now()
	for _, q := range liveWrites {
		q = strings.NewReplacer("$BIG", liveBigHex, "$NOTE", liveNote).Replace(q)
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	end := time.Now()
	// The large payload must really be stored out of line, or this proves
	// nothing about TOAST. (The note's 'u' in the Update proves its own.)
	var toastRel string
	var chunks int
	if err := conn.QueryRow(ctx, "SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 'public.outbox'::regclass").Scan(&toastRel); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(DISTINCT chunk_id) FROM "+toastRel).Scan(&chunks); err != nil {
		t.Fatal(err)
	}
	if chunks == 0 {
		t.Fatalf("the large payload is not TOASTed (%s is empty)", toastRel)
	}

	rows, err := conn.Query(ctx, livePeek)
	if err != nil {
		t.Fatal(err)
	}
	var got []peeked
	for rows.Next() {
		var lsn string
		var xid int64
		var data []byte
		if err := rows.Scan(&lsn, &xid, &data); err != nil {
			t.Fatal(err)
		}
		l, err := pglogrepl.ParseLSN(lsn)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, peeked{LSN: uint64(l), Xid: uint32(xid), Data: data})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Commit times are the server's clock, the test's within a second:
	// both run on this machine.
	checkScenario(t, got, func(ts time.Time) bool {
		return !ts.Before(start.Add(-time.Second)) && !ts.After(end.Add(time.Second))
	})
	// Only bytes that decoded as expected become the golden file.
	if *update && !t.Failed() {
		if err := writeGolden(goldenFile, pg.Version, got); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: %d messages", goldenFile, len(got))
	}
}
