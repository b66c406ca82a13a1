-- Orders, idempotency tokens and payment records. Amounts are integers in minor units; times are milliseconds
-- since the Unix epoch, as in the engine's tables.
CREATE TABLE orders (
    tenant     TEXT NOT NULL,
    order_no   TEXT NOT NULL,
    amount     BIGINT NOT NULL CHECK (amount > 0),
    currency   TEXT NOT NULL,
    status     TEXT NOT NULL,
    version    BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, order_no)
);

CREATE TABLE idempotency_tokens (
    token           TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL,
    state           TEXT NOT NULL,
    fingerprint     TEXT,
    route           TEXT,
    response_status INTEGER,
    response_body   TEXT,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);

-- request_no is unique per tenant, forever: a second use is "this already happened", never a new charge.
CREATE TABLE payments (
    tenant       TEXT NOT NULL,
    request_no   TEXT NOT NULL,
    order_no     TEXT NOT NULL,
    amount       BIGINT NOT NULL,
    currency     TEXT NOT NULL,
    status       TEXT NOT NULL,
    token        TEXT NOT NULL,
    charge_id    TEXT,
    decline_code TEXT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant, request_no)
);
CREATE INDEX payments_order ON payments (tenant, order_no);
