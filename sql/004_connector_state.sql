-- What the connector promised about its slot, written before each
-- confirmation it records is sent, so that a slot that moved behind its back
-- (recreated, advanced) is detected at start instead of skipping events.
CREATE TABLE IF NOT EXISTS public.outbox_connector_state (
    slot_name          text        PRIMARY KEY,
    system_identifier  text        NOT NULL,
    confirmed_lsn      pg_lsn      NOT NULL,
    snapshot_done      boolean     NOT NULL DEFAULT false,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- The leader lease (one row per slot): the holder, a fencing token that grows
-- on every acquisition, and an expiry computed with the database's clock.
CREATE TABLE IF NOT EXISTS public.outbox_lease (
    slot_name   text        PRIMARY KEY,
    holder      text        NOT NULL,
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
