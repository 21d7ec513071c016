-- Variant (not applied by default): what the connector's poll mode
-- (OUTBOX_SOURCE=poll) needs on the outbox table, for databases where a
-- replication slot is not possible. Apply it after sql/001_outbox.sql and
-- sql/003_dead_letter.sql. Writers need no change: every column has a default.
--
-- seq: taken at INSERT from a sequence handing out one value at a time
-- (CACHE 1), so that where the application serialises an aggregate's writes
-- a later write has a larger value. The relay publishes each aggregate's rows
-- in this order. It is never a cursor: a transaction that took a value first
-- may commit last, and the relay reads every unpublished row visible now,
-- whatever its value (no skipped late commit).
-- On a partitioned outbox before PostgreSQL 17 use a sequence default instead
-- of an identity column: ADD COLUMN seq bigserial.
ALTER TABLE public.outbox ADD COLUMN IF NOT EXISTS seq bigint GENERATED ALWAYS AS IDENTITY;

-- published_at: set by the relay once Kafka has the row (or it is durably
-- dead-lettered). Rows stay in the table for their retention (maintain
-- deletes them by age), as in the WAL mode's table mode.
ALTER TABLE public.outbox ADD COLUMN IF NOT EXISTS published_at timestamptz;

-- The relay's reads scan only this index: unpublished rows, in seq order.
-- It stays as small as the backlog (an entry leaves it once its row is
-- marked and vacuumed).
CREATE INDEX IF NOT EXISTS outbox_unpublished_idx ON public.outbox (seq) WHERE published_at IS NULL;

-- The same rows by bucket (the relay's OUTBOX_POLL_BUCKETS, 16 by default,
-- of the aggregate id): a reader reads each of its buckets through it, so a
-- bucket with nothing to publish costs one probe however large another
-- bucket's backlog (one hot aggregate). Its expression must be the relay's
-- exactly: with another bucket count or key column, create the one the
-- relay names in its log at start (CREATE INDEX CONCURRENTLY …) and drop
-- this one.
CREATE INDEX IF NOT EXISTS outbox_unpublished_bucket16_idx ON public.outbox
    (((hashtext(coalesce(aggregateid::text, '')) & 2147483647) % 16), seq) WHERE published_at IS NULL;

-- seq names a row (with its id) when the relay marks it, and orders an
-- aggregate's events: two rows must never share it. A cutover that keeps the
-- rows but not the sequence (logical replication carries no sequence values,
-- a restore of the table alone) leaves the sequence behind; the relay refuses
-- to start then, naming the setval that fixes it, and this index makes a
-- writer fail loudly rather than take a value an older row has. A unique
-- index of a partitioned table must include its partition key, so there seq
-- is only indexed (the relay's start check reads its largest value through
-- it); the start check and the relay's mark by seq and id cover the rest.
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'public.outbox'::regclass) = 'p' THEN
        CREATE INDEX IF NOT EXISTS outbox_seq_idx ON public.outbox (seq);
    ELSE
        CREATE UNIQUE INDEX IF NOT EXISTS outbox_seq_key ON public.outbox (seq);
    END IF;
END
$$;

-- A wake-up hint: one NOTIFY per inserting statement, so the relay polls at
-- once instead of at its next interval. Only a hint (NOTIFY is at most once
-- and does not pass a transaction pooler): the interval is the safety net.
-- Its cost: every transaction that notifies takes a cluster-wide lock at
-- commit, one at a time; drop the trigger on a write-heavy primary and lower
-- OUTBOX_POLL_INTERVAL instead.
CREATE OR REPLACE FUNCTION public.outbox_poll_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_poll', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_poll_notify ON public.outbox;
CREATE TRIGGER outbox_poll_notify AFTER INSERT ON public.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION public.outbox_poll_notify();

-- A row deleted before it is published would never be published: refuse it.
-- This stops a delete-after-insert writer (a WAL-only mode: the poll relay
-- reads the table, not the WAL) at its first write, and a cleanup that would
-- delete rows still waiting (the relay down for longer than the retention);
-- the outbox package's Cleaner skips them. Dropping a partition is not a
-- DELETE: drop only partitions whose rows are all published.
CREATE OR REPLACE FUNCTION public.outbox_poll_refuse_delete() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'outbox row % is not published yet and a poll-mode relay reads this table: deleting it would lose the event', OLD.id
        USING ERRCODE = 'restrict_violation',
              HINT = 'Write in table mode (delete-after-insert and logical messages are for the WAL relay only), and delete only rows whose published_at is set.';
END
$$;
DROP TRIGGER IF EXISTS outbox_poll_refuse_delete ON public.outbox;
CREATE TRIGGER outbox_poll_refuse_delete BEFORE DELETE ON public.outbox
    FOR EACH ROW WHEN (OLD.published_at IS NULL) EXECUTE FUNCTION public.outbox_poll_refuse_delete();

-- The poll mode's least-privilege role: no REPLICATION, no slot, no
-- publication. It reads the outbox, marks what it published, writes dead
-- letters. No password here: set it out of band.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_poller') THEN
        CREATE ROLE outbox_poller LOGIN;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO outbox_poller', current_database());
END
$$;
GRANT USAGE ON SCHEMA public TO outbox_poller;
GRANT SELECT, UPDATE (published_at) ON public.outbox TO outbox_poller;
-- connector switch-to-poll, run with the WAL relay's settings (role
-- outbox_connector), marks the rows the WAL relay delivered.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_connector') THEN
        GRANT UPDATE (published_at) ON public.outbox TO outbox_connector;
    END IF;
END
$$;
-- The relay checks at start that the sequence is ahead of the table.
DO $$
BEGIN
    EXECUTE format('GRANT SELECT ON SEQUENCE %s TO outbox_poller', pg_get_serial_sequence('public.outbox', 'seq'));
END
$$;
GRANT SELECT, INSERT ON public.outbox_dead_letter TO outbox_poller;
