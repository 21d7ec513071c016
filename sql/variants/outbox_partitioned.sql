-- Variant (not applied by default): a daily-partitioned outbox, replacing
-- sql/001_outbox.sql and sql/002_publication.sql on a new database. Apply it
-- instead of those two, then the remaining sql/*.sql files:
--
--   psql -v ON_ERROR_STOP=1 -f sql/variants/outbox_partitioned.sql
--   psql -v ON_ERROR_STOP=1 -f sql/003_dead_letter.sql ... (and the rest)
--
-- Old events go away by dropping a whole day's partition (a catalog change:
-- no row-by-row DELETE, no dead tuples, no vacuum debt). The `maintain`
-- command (package outbox/partition) creates the coming days' partitions and
-- drops the expired ones; run it at least daily (e.g. hourly from cron).
--
-- Migrating an existing, unpartitioned outbox: create this table under another
-- name, switch the writers in one deploy (the connector follows the table named
-- by OUTBOX_TABLE and the publication), and drop the old table once the relay
-- has passed its last insert. Dropping a partition never loses an event the
-- relay has not published yet: the relay reads the WAL, which keeps the insert,
-- and logical decoding decodes it with the catalog as it was (the slot's
-- catalog_xmin keeps that catalog alive).
CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid         NOT NULL,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now(),
    -- The writer's W3C trace context, as in sql/001_outbox.sql.
    tracingspancontext text,
    -- A primary key of a partitioned table must contain the partition key.
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE INDEX IF NOT EXISTS outbox_created_at_idx ON public.outbox (created_at);

-- Rows outside every daily partition land here instead of failing the
-- business transaction. It should stay empty: `maintain` creates partitions
-- ahead of time, moves a day's rows out of here into the partition it creates
-- for that day, and deletes the rows here whose day has expired.
CREATE TABLE IF NOT EXISTS public.outbox_default PARTITION OF public.outbox DEFAULT;

-- Today's and tomorrow's partitions (UTC days), so that the table works
-- before `maintain` first runs.
DO $$
DECLARE
    d date;
BEGIN
    FOR i IN 0..1 LOOP
        d := (now() AT TIME ZONE 'UTC')::date + i;
        EXECUTE format(
            'CREATE TABLE IF NOT EXISTS public.%I PARTITION OF public.outbox FOR VALUES FROM (%L) TO (%L)',
            'outbox_p' || to_char(d, 'YYYYMMDD'),
            d::text || ' 00:00:00+00', (d + 1)::text || ' 00:00:00+00');
    END LOOP;
END
$$;

COMMENT ON TABLE public.outbox IS
    'Transactional outbox, partitioned by day (created_at, UTC); old partitions are dropped by maintain.';

-- publish_via_partition_root: changes of every partition, present and future,
-- are published as changes of public.outbox, the table the connector follows.
-- A FOR TABLES IN SCHEMA or FOR ALL TABLES publication with it works too:
-- `maintain` moves DEFAULT rows through an UNLOGGED table made logged before
-- it is attached, which no publication publishes (package outbox/partition).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outbox_pub') THEN
        CREATE PUBLICATION outbox_pub FOR TABLE public.outbox
            WITH (publish = 'insert', publish_via_partition_root = true);
    END IF;
END
$$;
