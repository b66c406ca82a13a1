-- Merchant events (contracts/events.md): the outbox, the webhook endpoints, the deliveries with their stored
-- schedule, and every attempt. Times are milliseconds since the Unix epoch, as everywhere; text compares
-- case-sensitively (binary collation, see 0001).

-- One row per outcome: `id` is derived from the outcome (`evt_` and 128 bits of SHA-256 over tenant, kind and
-- the outcome's key), so its unique key is what allows one event per outcome. Written by the outcome's own
-- transaction, so kept small.
--
-- `seq` is the log's order, given after commit: an AUTO_INCREMENT is taken at insert, and a transaction that
-- took a smaller one may commit after one that took a larger one, so a reader paging by it could skip an event.
-- The sequencer (one transaction at a time, under the lock of `event_sequence`'s row) numbers committed events
-- that have none, each number above every one given before; the log shows numbered events only.
--
-- `n` numbers rows as they are inserted (the primary key: InnoDB appends rows in its order); the sequencer
-- numbers the events of one pass in its order, the closest to their commits that MySQL can tell.
CREATE TABLE events (
    n           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id          VARCHAR(64) NOT NULL,
    tenant      VARCHAR(255) NOT NULL,
    type        VARCHAR(64) NOT NULL,
    data        LONGTEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    traceparent VARCHAR(255),
    seq         BIGINT,
    UNIQUE KEY events_id (id),
    UNIQUE KEY events_log (seq),
    KEY events_tenant_log (tenant, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The last number the sequencer gave; one row, whose lock makes it one sequencer at a time.
CREATE TABLE event_sequence (
    id       INT NOT NULL PRIMARY KEY,
    position BIGINT NOT NULL
) ENGINE = InnoDB;
INSERT INTO event_sequence (id, position) VALUES (1, 0);

-- The last event the dispatcher turned into deliveries (its position in the log); one row.
CREATE TABLE event_dispatch (
    id       INT NOT NULL PRIMARY KEY,
    position BIGINT NOT NULL,
    event_id VARCHAR(64) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT INTO event_dispatch (id, position, event_id) VALUES (1, 0, '');

-- Per tenant, the position of the newest event the retention pass deleted: a cursor at or before it may have
-- missed one (`410 cursor_expired`).
CREATE TABLE event_horizons (
    tenant   VARCHAR(255) NOT NULL PRIMARY KEY,
    position BIGINT NOT NULL,
    event_id VARCHAR(64) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A tenant's endpoints. The secret signs (HMAC needs the key itself, so it is kept as given); during a rotation
-- the previous one signs too, until `previous_until`.
CREATE TABLE webhook_endpoints (
    id              VARCHAR(64) NOT NULL PRIMARY KEY,
    tenant          VARCHAR(255) NOT NULL,
    url             TEXT NOT NULL,
    events          TEXT,
    secret          VARCHAR(255) NOT NULL,
    previous_secret VARCHAR(255),
    previous_until  BIGINT,
    enabled         BOOLEAN NOT NULL,
    disabled_reason VARCHAR(255),
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    KEY webhook_endpoints_tenant (tenant, created_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One event to one endpoint: pending until delivered or failed. `next_attempt_at` is when it is due, and while
-- an attempt is in flight the end of that attempt's lease; `claim` fences the claimer's writes. `schedule` is
-- the waits (ms) between attempts, as when it was created. MySQL has no partial indexes: the state leads.
CREATE TABLE webhook_deliveries (
    id              VARCHAR(64) NOT NULL PRIMARY KEY,
    event_id        VARCHAR(64) NOT NULL,
    endpoint_id     VARCHAR(64) NOT NULL,
    tenant          VARCHAR(255) NOT NULL,
    state           VARCHAR(16) NOT NULL,
    attempts        INT NOT NULL,
    claim           BIGINT NOT NULL,
    next_attempt_at BIGINT NOT NULL,
    schedule        TEXT NOT NULL,
    last_status     INT,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    KEY webhook_deliveries_due (state, endpoint_id, next_attempt_at),
    KEY webhook_deliveries_pending (state, created_at),
    KEY webhook_deliveries_event (event_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Every attempt: in flight from its claim, then delivered, failed (with the next attempt's time) or abandoned
-- (its process stopped; the delivery is tried again).
CREATE TABLE webhook_attempts (
    delivery_id     VARCHAR(64) NOT NULL,
    attempt         INT NOT NULL,
    endpoint_id     VARCHAR(64) NOT NULL,
    event_id        VARCHAR(64) NOT NULL,
    tenant          VARCHAR(255) NOT NULL,
    outcome         VARCHAR(16) NOT NULL,
    started_at      BIGINT NOT NULL,
    finished_at     BIGINT,
    status_code     INT,
    latency_ms      BIGINT,
    error           TEXT,
    next_attempt_at BIGINT,
    PRIMARY KEY (delivery_id, attempt),
    KEY webhook_attempts_endpoint (endpoint_id, started_at, delivery_id, attempt)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
