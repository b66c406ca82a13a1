-- no-transaction
-- The retention pass deletes unused tokens once expired (`expires_at`), a batch at a time: each batch is one
-- bounded range of this index, oldest first. Partial, on an integer: a token is in it only while unused, so a
-- payment changes it once (claiming its token, `issued` → `in_use`, takes it out: no new entry). Built
-- CONCURRENTLY, outside a transaction, so a rolling deploy never blocks the writers of older binaries (one
-- statement per file: Postgres runs the statements of one migration call in one implicit transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS tokens_unused ON idempotency_tokens (expires_at) WHERE state = 'issued';
