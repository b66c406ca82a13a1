-- Refunds (issue 36): a merchant gives money back on a succeeded payment, in parts, exactly once.
--
-- A payment carries what its refunds took: `refunded_amount` (refunds the channel said succeeded) and
-- `refund_reserved` (refunds asked of the channel, not settled yet). A refund reserves its amount by one
-- conditional update (reserved + refunded + this <= amount, rows affected checked) before the channel is asked,
-- moves it to refunded when the channel says succeeded, and releases it when the channel says failed. Columns with
-- a constant default are added without rewriting the table (Postgres 11+).
ALTER TABLE payments ADD COLUMN IF NOT EXISTS refunded_amount BIGINT NOT NULL DEFAULT 0;
ALTER TABLE payments ADD COLUMN IF NOT EXISTS refund_reserved BIGINT NOT NULL DEFAULT 0;
-- What the conditional updates keep, said once more by the database for every later write (NOT VALID: the rows
-- written before hold zeros, so no scan of the table is needed to trust them).
ALTER TABLE payments ADD CONSTRAINT payments_refunds_within_amount
    CHECK (refunded_amount >= 0 AND refund_reserved >= 0 AND refunded_amount + refund_reserved <= amount) NOT VALID;

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
-- A payment's refunds, newest first (GET /v1/payments/{request_no}/refunds); led by the number, as
-- payments_order is (see 0006).
CREATE INDEX IF NOT EXISTS refunds_payment ON refunds (request_no, tenant, created_at);
CREATE UNIQUE INDEX IF NOT EXISTS refunds_channel_no ON refunds (tenant, merchant_refund_no);
-- The unresolved refunds (asked of the channel, not settled), oldest first: what GET /metrics counts.
CREATE INDEX IF NOT EXISTS refunds_unresolved ON refunds (created_at) WHERE status = 'processing';
