-- no-transaction
-- The retention pass deletes used tokens (with their stored responses) once their response retention has passed
-- since the payment ended (`updated_at`), a batch at a time: each batch is one bounded range of this index,
-- oldest first. Partial, on an integer: a payment adds one entry, when it completes its token. CONCURRENTLY, as
-- 0010 and for the same reasons.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tokens_used ON idempotency_tokens (updated_at) WHERE state = 'completed';
