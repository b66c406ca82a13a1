-- no-transaction
-- The retention pass deletes finished workflows by the time they ended, oldest first, a batch at a time: this
-- partial index holds only those it may delete (a compensation_failed workflow waits for an operator and is
-- never deleted), so each batch is one bounded index scan. Built CONCURRENTLY, outside a transaction, so a
-- rolling deploy never blocks the writers of older binaries (one statement per file: Postgres runs the
-- statements of one migration call in one implicit transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflows_finished ON workflows (updated_at)
    WHERE state IN ('completed', 'failed', 'cancelled');
