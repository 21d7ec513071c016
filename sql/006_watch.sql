-- The end-to-end watch (slotwatch with SLOTWATCH_OUTBOX_DSN): its canary
-- commits a small event through the outbox every SLOTWATCH_CANARY_INTERVAL
-- and reads it back from Kafka; its audit compares the events the table
-- holds with the records on the topics.
--
-- outbox_watch may insert outbox rows (the canary), read the columns the
-- audit reports (no payload), and delete canary rows through
-- outbox_delete_canaries and nothing else: it cannot delete or change a
-- real event. Set its password out of band, as for the other roles.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_watch') THEN
        CREATE ROLE outbox_watch LOGIN;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO outbox_watch', current_database());
END
$$;

GRANT USAGE ON SCHEMA public TO outbox_watch;
GRANT INSERT ON public.outbox TO outbox_watch;
GRANT SELECT (id, aggregatetype, aggregateid, created_at) ON public.outbox TO outbox_watch;
-- An event in the dead-letter table (too large for any topic) is
-- dead-lettered, not missing: the audit reads its id, nothing else.
GRANT SELECT (id) ON public.outbox_dead_letter TO outbox_watch;

-- Canary rows are deleted once they are an hour old (slotwatch calls this
-- about once a minute). SECURITY DEFINER with a fixed search_path: the
-- function runs as the table's owner and touches only the canary's rows.
CREATE OR REPLACE FUNCTION public.outbox_delete_canaries(older_than interval)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM public.outbox
        WHERE aggregatetype = '__canary' AND created_at < now() - older_than
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;

REVOKE ALL ON FUNCTION public.outbox_delete_canaries(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.outbox_delete_canaries(interval) TO outbox_watch;
