-- Least-privilege roles. No passwords here: set them out of band
-- (ALTER ROLE ... PASSWORD, or certificates) so no secret lives in the repo.
--
-- outbox_connector: streams the slot (REPLICATION), reads the outbox for the
-- initial snapshot, writes dead letters and its own state. It is no superuser
-- and owns nothing but its state tables. It does not create the publication
-- (this file does); it creates its slot, which REPLICATION allows.
-- outbox_slotwatch: reads replication views through pg_monitor, nothing else.
-- docs/security.md explains each grant, and what managed PostgreSQL services
-- (no superuser) need instead of REPLICATION.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_connector') THEN
        CREATE ROLE outbox_connector LOGIN REPLICATION;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_slotwatch') THEN
        CREATE ROLE outbox_slotwatch LOGIN;
    END IF;
END
$$;

GRANT pg_monitor TO outbox_slotwatch;

-- PUBLIC may connect by default, but hardened databases revoke that (CIS
-- benchmarks, some managed services' templates): say it explicitly.
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO outbox_connector, outbox_slotwatch', current_database());
END
$$;

GRANT USAGE ON SCHEMA public TO outbox_connector;
GRANT SELECT ON public.outbox TO outbox_connector;                       -- initial snapshot
GRANT SELECT, INSERT, DELETE ON public.outbox_dead_letter TO outbox_connector; -- dead letters, redrive
ALTER TABLE public.outbox_connector_state OWNER TO outbox_connector;
ALTER TABLE public.outbox_lease OWNER TO outbox_connector;
ALTER TABLE public.outbox_backfill OWNER TO outbox_connector;
GRANT SELECT, INSERT, UPDATE, DELETE ON public.outbox_backfill_failed TO outbox_connector; -- backfill's unpublished rows
