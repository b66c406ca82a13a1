-- Whose workflow it is (`Workflow::tenant`; the payment saga's tenant), so that a tenant's list filters in the
-- query and pages by (created_at, workflow_id) through the index of 0012. Nullable without a default: adding it
-- changes the catalog only (no rewrite; the ACCESS EXCLUSIVE lock is held for an instant, once earlier
-- transactions on the table end). Rows already there are not backfilled: an UPDATE of every row would write a
-- new version of each (twice the table until vacuum, its whole size in WAL) and hold every row's lock until it
-- commits, blocking the commits of running workflows. Those rows (and rows older binaries insert during a rolling
-- deploy) keep a NULL tenant: operators list them, a tenant reads each by id (its input names the tenant) but
-- does not list them, and the history retention deletes them once they are finished.
-- The lock waits for transactions already on the table, and every query queues behind it meanwhile: a bounded wait
-- fails the migration (run it again) instead of stalling the service behind one long transaction.
SET LOCAL lock_timeout = '5s';
ALTER TABLE workflows ADD COLUMN tenant TEXT;
