-- The retention pass deletes unused tokens once expired (`expires_at`) and used ones once their response
-- retention has passed since the payment ended (`updated_at`), a batch at a time: each batch is one bounded
-- range of one of these indexes, oldest first. Partial, on an integer: a token is in one only while it may be
-- deleted by that time, so a payment changes each once (claiming its token, `issued` → `in_use`, removes it from
-- the first; completing it adds it to the second), and a token `in_use` is in neither.
CREATE INDEX IF NOT EXISTS tokens_unused ON idempotency_tokens (expires_at) WHERE state = 'issued';
CREATE INDEX IF NOT EXISTS tokens_used ON idempotency_tokens (updated_at) WHERE state = 'completed';
