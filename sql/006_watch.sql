-- The end-to-end watch (slotwatch with SLOTWATCH_OUTBOX_DSN): its canary
-- commits a small event through the outbox every SLOTWATCH_CANARY_INTERVAL
-- and reads it back from Kafka; its audit compares the events the table
-- holds with the records on the topics.
--
-- outbox_watch may write canary rows through outbox_write_canary, read the
-- columns the audit reports (no payload), and delete old canary rows
-- through outbox_delete_canaries, and nothing else: it cannot write,
-- change or delete a real event, so a leaked monitoring password cannot
-- publish forged events to real topics. Set its password out of band, as
-- for the other roles.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_watch') THEN
        CREATE ROLE outbox_watch LOGIN;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO outbox_watch', current_database());
END
$$;

GRANT USAGE ON SCHEMA public TO outbox_watch;
-- Earlier versions of this file granted INSERT on the outbox: take it back.
REVOKE INSERT ON public.outbox FROM outbox_watch;
GRANT SELECT (id, aggregatetype, aggregateid, created_at) ON public.outbox TO outbox_watch;
-- An event in the dead-letter table (too large for any topic) is
-- dead-lettered, not missing: the audit reads its id, nothing else.
GRANT SELECT (id) ON public.outbox_dead_letter TO outbox_watch;

-- The canary's only way into the outbox: a row of aggregate type
-- '__canary' and type 'Canary', whatever the caller passes, so it goes to
-- the canary's topic only. The payload is bounded (a canary's is a few
-- dozen bytes). SECURITY DEFINER with a fixed search_path: it runs as the
-- table's owner and names its table schema-qualified.
CREATE OR REPLACE FUNCTION public.outbox_write_canary(canary_id uuid, instance text, body jsonb)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF octet_length(body::text) > 1024 THEN
        RAISE EXCEPTION 'outbox_write_canary: a payload of % bytes; a canary''s is under 1 kB', octet_length(body::text)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
    VALUES (canary_id, '__canary', instance, 'Canary', body);
END
$$;

REVOKE ALL ON FUNCTION public.outbox_write_canary(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.outbox_write_canary(uuid, text, jsonb) TO outbox_watch;

-- Canary rows are deleted once they are an hour old (slotwatch calls this
-- about once a minute). Never younger than 10 minutes, whatever the caller
-- asks: a canary not yet relayed (poll mode reads the table) must stay.
-- SECURITY DEFINER with a fixed search_path: the function runs as the
-- table's owner and touches only the canary's rows.
CREATE OR REPLACE FUNCTION public.outbox_delete_canaries(older_than interval)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM public.outbox
        WHERE aggregatetype = '__canary' AND created_at < now() - GREATEST(older_than, interval '10 minutes')
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;

REVOKE ALL ON FUNCTION public.outbox_delete_canaries(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.outbox_delete_canaries(interval) TO outbox_watch;
