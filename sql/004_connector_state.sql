-- What the connector promised about its slot, written before each
-- confirmation it records is sent, so that a slot that moved behind its back
-- (recreated, advanced) is detected at start instead of skipping events.
-- offsets_epoch names the history the exactly-once positions in Kafka are
-- valid in (a new one whenever the slot is created again), and offsets_lsn
-- is the newest position the connector saw Kafka commit in it: a start that
-- finds the offsets topic behind it (deleted, emptied) says so instead of
-- publishing again silently.
-- recover_xmin, recover_lsn and recover_at are the recovery point: the oldest
-- transaction id (xid8, as a number) that was still running when the WAL
-- was at recover_lsn, at or before a position whose events were all
-- delivered. Every event not delivered was written by a transaction with an
-- id at least recover_xmin, so a lost slot is recovered by publishing again
-- the outbox rows with such ids (OUTBOX_ON_SLOT_LOSS=recover, connector
-- recover). recovering says that the snapshot the row still owes
-- (snapshot_done false) is that window, not the whole table. messages_seen
-- says the slot carried events written as logical decoding messages, which
-- the table never holds: no recovery from the table is complete then.
-- timeline is the server's timeline at the last write: a promoted standby
-- finds its replicated row written on an earlier one.
-- recover_floor_xmin and recover_floor_at are what the snapshot the row
-- still owes (the initial snapshot, or a recovery's window) read first of
-- the rows it owes: the oldest one's transaction id (xid8, as a number; 0:
-- it owed none) and created_at. A later attempt reads the table as it is
-- then, and refuses unless a row at least as old is still there: a
-- retention, which deletes by age, deleted none of the rows owed. NULL once
-- the snapshot is done.
CREATE TABLE IF NOT EXISTS public.outbox_connector_state (
    slot_name          text        PRIMARY KEY,
    system_identifier  text        NOT NULL,
    confirmed_lsn      pg_lsn      NOT NULL,
    snapshot_done      boolean     NOT NULL DEFAULT false,
    updated_at         timestamptz NOT NULL DEFAULT now(),
    offsets_epoch      bigint,
    offsets_lsn        pg_lsn,
    recover_xmin       bigint,
    recover_lsn        pg_lsn,
    recover_at         timestamptz,
    recovering         boolean     NOT NULL DEFAULT false,
    messages_seen      boolean     NOT NULL DEFAULT false,
    timeline           integer,
    recover_floor_xmin bigint,
    recover_floor_at   timestamptz
);
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS offsets_epoch bigint;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS offsets_lsn pg_lsn;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recover_xmin bigint;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recover_lsn pg_lsn;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recover_at timestamptz;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recovering boolean NOT NULL DEFAULT false;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS messages_seen boolean NOT NULL DEFAULT false;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS timeline integer;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recover_floor_xmin bigint;
ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recover_floor_at timestamptz;

-- The leader lease (one row per slot): the holder, a fencing token that grows
-- on every acquisition, and an expiry computed with the database's clock.
-- holder_pid is the backend pid of the holder's lease session: when that
-- session no longer exists (the holder was killed, or its connection cut), a
-- standby takes over at once instead of waiting for the expiry. NULL once the
-- holder released the lease. Never delete a row: its token must keep growing.
-- A new leader terminates the previous leader's lease session and walsender
-- (pg_terminate_backend): a role may end its own sessions, so run every
-- instance as the same role (outbox_connector, sql/005); instances running as
-- different roles need GRANT pg_signal_backend, and without it the new leader
-- waits for the old walsender's wal_sender_timeout (capped at the lease TTL on
-- the connector's replication connection).
CREATE TABLE IF NOT EXISTS public.outbox_lease (
    slot_name   text        PRIMARY KEY,
    holder      text        NOT NULL,
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    holder_pid  integer
);
ALTER TABLE public.outbox_lease ADD COLUMN IF NOT EXISTS holder_pid integer;

-- Backfills (connector backfill): one row per named run, its selection and
-- the end of its range (fixed by the first run when none was given), the
-- rows it had to publish, has published and could not publish, and the key
-- of the last row Kafka acknowledged (the order column's value as text, and
-- the event id), so that a run interrupted (killed) resumes after it.
CREATE TABLE IF NOT EXISTS public.outbox_backfill (
    name        text        PRIMARY KEY,
    selection   text        NOT NULL,
    range_to    timestamptz NOT NULL,
    total       bigint      NOT NULL,
    done        bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    last_key    text,
    last_id     text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);

-- Rows a backfill could not publish and will not by retrying as they are
-- (unroutable, or larger than OUTBOX_KAFKA_MAX_MESSAGE_BYTES): the event id
-- and why, written in the same transaction as the progress that moves past
-- them, so that a finished run with rows here is never a plain "done".
-- connector backfill -retry-failed publishes them again and deletes those
-- that went out. Deleting the run's outbox_backfill row deletes its rows here.
CREATE TABLE IF NOT EXISTS public.outbox_backfill_failed (
    name      text        NOT NULL REFERENCES public.outbox_backfill (name) ON DELETE CASCADE,
    id        text        NOT NULL,
    reason    text        NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, id)
);
