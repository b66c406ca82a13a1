-- Orders, idempotency tokens and payment records. Amounts are integers in minor units; times are milliseconds
-- since the Unix epoch. Text compares case-sensitively (binary collation, see 0001).
CREATE TABLE orders (
    tenant     VARCHAR(255) NOT NULL,
    order_no   VARCHAR(255) NOT NULL,
    amount     BIGINT NOT NULL CHECK (amount > 0),
    currency   VARCHAR(16) NOT NULL,
    status     VARCHAR(32) NOT NULL,
    version    BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, order_no)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE idempotency_tokens (
    token           VARCHAR(255) NOT NULL PRIMARY KEY,
    tenant          VARCHAR(255) NOT NULL,
    state           VARCHAR(32) NOT NULL,
    fingerprint     VARCHAR(64),
    route           VARCHAR(255),
    response_status INT,
    response_body   LONGTEXT,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- request_no is unique per tenant, forever: a second use is "this already happened", never a new charge.
CREATE TABLE payments (
    tenant       VARCHAR(255) NOT NULL,
    request_no   VARCHAR(255) NOT NULL,
    order_no     VARCHAR(255) NOT NULL,
    amount       BIGINT NOT NULL,
    currency     VARCHAR(16) NOT NULL,
    status       VARCHAR(32) NOT NULL,
    token        VARCHAR(255) NOT NULL,
    charge_id    TEXT,
    decline_code TEXT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant, request_no),
    KEY payments_order (tenant, order_no)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
