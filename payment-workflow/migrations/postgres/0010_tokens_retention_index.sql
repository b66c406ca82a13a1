-- no-transaction
-- The retention pass deletes unused tokens once expired (`expires_at`) and used ones once their response
-- retention has passed since the payment ended (`updated_at`), a batch at a time. One index serves both, keyed
-- by the time a token's retention counts from (the queries in src/store/standard.rs repeat this expression
-- exactly, so the planner uses it): each batch is one bounded index range. Built CONCURRENTLY, outside a
-- transaction, so a rolling deploy never blocks the writers of older binaries (one statement per file:
-- Postgres runs the statements of one migration call in one implicit transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS tokens_retention ON idempotency_tokens
    (state, (CASE WHEN state = 'issued' THEN expires_at ELSE updated_at END));
