-- Events that could not be published to Kafka at all (bigger than the
-- broker accepts) are kept here whole, with the reason, so that nothing is
-- dropped; `connector redrive` re-publishes them once the cause is fixed.
CREATE TABLE IF NOT EXISTS public.outbox_dead_letter (
    id            text         PRIMARY KEY,           -- the event id
    aggregatetype text,
    aggregateid   text,
    type          text,
    payload       text,                               -- as stored, in its text form
    row_data      jsonb        NOT NULL,              -- every original column, as text
    column_types  jsonb,                              -- column name -> PostgreSQL type OID
    topic         text,                               -- the topic the event was meant for
    error         text         NOT NULL,
    error_class   text         NOT NULL,
    source_lsn    pg_lsn,
    created_at    timestamptz  NOT NULL DEFAULT now()
);

-- Added after the first release of this file: keep applying it harmless.
ALTER TABLE public.outbox_dead_letter ADD COLUMN IF NOT EXISTS column_types jsonb;
