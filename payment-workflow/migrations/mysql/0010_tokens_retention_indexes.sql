-- The retention pass deletes unused tokens once expired (`expires_at`) and used ones once their response
-- retention has passed since the payment ended (`updated_at`), a batch at a time: each batch is one bounded
-- index range. InnoDB builds them online (ALGORITHM=INPLACE, LOCK=NONE): writers are not blocked meanwhile.
ALTER TABLE idempotency_tokens
    ADD INDEX tokens_expiry (state, expires_at),
    ADD INDEX tokens_ended (state, updated_at),
    ALGORITHM = INPLACE, LOCK = NONE;
