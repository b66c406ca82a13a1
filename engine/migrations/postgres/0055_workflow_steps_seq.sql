-- The order in which a workflow first ran each step (0, 1, 2, … per workflow), so that every view lists steps as
-- they ran: the steps of one phase commit together and share their start time to the millisecond, and the key
-- breaks no tie in the order they ran. Nullable without a default: the catalog changes, no row is rewritten.
-- Rows already there keep a NULL and sort first (they ran before any row that has one), then by start time.
SET LOCAL lock_timeout = '5s';
ALTER TABLE workflow_steps ADD COLUMN seq INTEGER;
