-- The publication the connector streams: inserts only, since an outbox row is
-- an event and is never updated; deletes (cleanup) must not reach Kafka.
-- CREATE PUBLICATION has no IF NOT EXISTS: guard it so this file applies twice.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outbox_pub') THEN
        CREATE PUBLICATION outbox_pub FOR TABLE public.outbox WITH (publish = 'insert');
    END IF;
END
$$;
