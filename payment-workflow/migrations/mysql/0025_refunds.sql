-- Refunds (issue 36): a merchant gives money back on a succeeded payment, in parts, exactly once.
--
-- A payment carries what its refunds took: `refunded_amount` (refunds the channel said succeeded) and
-- `refund_reserved` (refunds asked of the channel, not settled yet). A refund reserves its amount by one
-- conditional update (reserved + refunded + this <= amount, rows matched checked) before the channel is asked,
-- moves it to refunded when the channel says succeeded, and releases it when the channel says failed. Columns
-- added at the end with a constant default are instant on MariaDB 10.3+ and MySQL 8.0.12+ (no copy of the table).
ALTER TABLE payments
    ADD COLUMN refunded_amount BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN refund_reserved BIGINT NOT NULL DEFAULT 0;

-- refund_no is unique per tenant, forever; merchant_refund_no, the number the channel knows the refund by, is
-- derived from it (model/numbers.rs) and unique per tenant (the channel's merchant) too.
CREATE TABLE refunds (
    tenant             VARCHAR(255) NOT NULL,
    refund_no          VARCHAR(255) NOT NULL,
    request_no         VARCHAR(255) NOT NULL,
    order_no           VARCHAR(255) NOT NULL,
    amount             BIGINT NOT NULL CHECK (amount > 0),
    currency           VARCHAR(16) NOT NULL,
    status             VARCHAR(32) NOT NULL,
    reason             TEXT,
    token              VARCHAR(255) NOT NULL,
    merchant_refund_no VARCHAR(255) NOT NULL,
    refund_id          TEXT,
    created_at         BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    PRIMARY KEY (tenant, refund_no),
    -- A payment's refunds, newest first (GET /v1/payments/{request_no}/refunds).
    KEY refunds_payment (tenant, request_no, created_at),
    UNIQUE KEY refunds_channel_no (tenant, merchant_refund_no),
    -- The unresolved refunds, oldest first (MySQL has no partial index: led by the status).
    KEY refunds_unresolved (status, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
