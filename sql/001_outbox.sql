-- The outbox table, with Debezium's default EventRouter columns, so that a
-- team moving from Debezium keeps its writers unchanged. Services insert one
-- row per event in the same transaction as their business change.
CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now()
);

-- Cleanup deletes published rows by age in small batches.
CREATE INDEX IF NOT EXISTS outbox_created_at_idx ON public.outbox (created_at);

COMMENT ON TABLE public.outbox IS
    'Transactional outbox: rows are read from the WAL by the connector and published to Kafka (topic outbox.event.<aggregatetype>, key aggregateid).';
