-- Undoes sql/variants/outbox_poll.sql, for a switch from poll mode back to
-- the WAL relay (README, "Switching between the WAL relay and poll mode").
-- Apply it only once no poll relay runs and the WAL relay streams, after
-- every row written before the WAL relay's start is published: the WAL relay
-- never sets published_at, so while the column is there the outbox
-- package's Cleaner and maintain's DEFAULT-partition cleanup keep every row
-- written since (they delete only published rows), and the table grows
-- without bound. Dropping the columns is a catalog change (no rewrite); it
-- takes an ACCESS EXCLUSIVE lock on the outbox for a moment.
DROP TRIGGER IF EXISTS outbox_poll_refuse_delete ON public.outbox;
DROP FUNCTION IF EXISTS public.outbox_poll_refuse_delete();
DROP TRIGGER IF EXISTS outbox_poll_notify ON public.outbox;
DROP FUNCTION IF EXISTS public.outbox_poll_notify();
DROP INDEX IF EXISTS public.outbox_unpublished_idx;
ALTER TABLE public.outbox DROP COLUMN IF EXISTS published_at;
-- seq (and its unique index) stays: sql/variants/outbox_snapshot_order.sql
-- orders the WAL relay's initial snapshot by such a column. Drop it too if
-- nothing else uses it:
--   ALTER TABLE public.outbox DROP COLUMN IF EXISTS seq;
