-- Refunds (issue 36): a merchant gives money back on a succeeded payment, in parts, exactly once.
--
-- A payment carries what its refunds took: `refunded_amount` (refunds the channel said succeeded) and
-- `refund_reserved` (refunds asked of the channel, not settled yet). A refund reserves its amount by one
-- conditional update (reserved + refunded + this <= amount, rows affected checked) before the channel is asked,
-- moves it to refunded when the channel says succeeded, and releases it when the channel says failed.
ALTER TABLE payments ADD COLUMN refunded_amount BIGINT NOT NULL DEFAULT 0;
ALTER TABLE payments ADD COLUMN refund_reserved BIGINT NOT NULL DEFAULT 0;

-- refund_no is unique per tenant, forever; merchant_refund_no, the number the channel knows the refund by, is
-- derived from it (model/numbers.rs) and unique per tenant (the channel's merchant) too.
CREATE TABLE IF NOT EXISTS refunds (
    tenant             TEXT NOT NULL,
    refund_no          TEXT NOT NULL,
    request_no         TEXT NOT NULL,
    order_no           TEXT NOT NULL,
    amount             BIGINT NOT NULL CHECK (amount > 0),
    currency           TEXT NOT NULL,
    status             TEXT NOT NULL,
    reason             TEXT,
    token              TEXT NOT NULL,
    merchant_refund_no TEXT NOT NULL,
    refund_id          TEXT,
    created_at         BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    PRIMARY KEY (tenant, refund_no)
);
-- A payment's refunds, newest first (GET /v1/payments/{request_no}/refunds).
CREATE INDEX IF NOT EXISTS refunds_payment ON refunds (request_no, tenant, created_at);
CREATE UNIQUE INDEX IF NOT EXISTS refunds_channel_no ON refunds (tenant, merchant_refund_no);
-- The unresolved refunds (asked of the channel, not settled), oldest first: what GET /metrics counts.
CREATE INDEX IF NOT EXISTS refunds_unresolved ON refunds (created_at) WHERE status = 'processing';
