-- The outbox table, with Debezium's default EventRouter columns, so that a
-- team moving from Debezium keeps its writers unchanged. Services insert one
-- row per event in the same transaction as their business change.
CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now(),
    -- The writer's W3C trace context (traceparent=… and tracestate=… lines,
    -- java.util.Properties text, as Debezium's outbox extensions write it);
    -- the connector sends it as the traceparent/tracestate headers. NULL for
    -- an untraced write.
    tracingspancontext text
);

-- A table made before the column existed gets it. A DO block that looks in
-- the catalog, not ADD COLUMN IF NOT EXISTS, so that applying sql/ again
-- prints no notice ("already exists, skipping"). Writers without a trace
-- never name the column, so they work on either table.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'public.outbox'::regclass AND attname = 'tracingspancontext' AND NOT attisdropped) THEN
        -- ADD COLUMN takes an ACCESS EXCLUSIVE lock: queued behind a long
        -- transaction it would hold up every writer of the outbox. Give up
        -- after 5 s instead; apply the file again when the table is quiet.
        PERFORM set_config('lock_timeout', '5s', true);
        ALTER TABLE public.outbox ADD COLUMN tracingspancontext text;
    END IF;
END
$$;

-- Cleanup deletes published rows by age in small batches.
CREATE INDEX IF NOT EXISTS outbox_created_at_idx ON public.outbox (created_at);

COMMENT ON TABLE public.outbox IS
    'Transactional outbox: rows are read from the WAL by the connector and published to Kafka (topic outbox.event.<aggregatetype>, key aggregateid).';
