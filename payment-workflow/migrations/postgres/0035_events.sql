-- Merchant events (contracts/events.md): the outbox, the webhook endpoints, the deliveries with their stored
-- schedule, and every attempt. Times are milliseconds since the Unix epoch, as everywhere.

-- One row per outcome: `id` is derived from the outcome (`evt_` and 128 bits of SHA-256 over tenant, kind and
-- the outcome's key), so the primary key is what allows one event per outcome. Written by the outcome's own
-- commit, so kept small: no index but the key and the two log orders.
--
-- `txid` is the writing transaction's id: the log is read in (txid, id) order, and only below the oldest
-- transaction still running (`pg_snapshot_xmin`), so that an event that commits later than a reader's cursor was
-- taken can never sort before it (a smaller id committing after a larger one is exactly what sequences do).
CREATE TABLE events (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    traceparent TEXT,
    txid        xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX events_log ON events (txid, id);
CREATE INDEX events_tenant_log ON events (tenant, txid, id);

-- The last event the dispatcher turned into deliveries (its position in the log); one row.
CREATE TABLE event_dispatch (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    txid     xid8 NOT NULL,
    event_id TEXT NOT NULL
);
INSERT INTO event_dispatch (id, txid, event_id) VALUES (1, '0', '');

-- Per tenant, the position of the newest event the retention pass deleted: a cursor at or before it may have
-- missed one (`410 cursor_expired`).
CREATE TABLE event_horizons (
    tenant   TEXT PRIMARY KEY,
    position BIGINT NOT NULL,
    event_id TEXT NOT NULL
);

-- A tenant's endpoints. The secret signs (HMAC needs the key itself, so it is kept as given); during a rotation
-- the previous one signs too, until `previous_until`.
CREATE TABLE webhook_endpoints (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL,
    url             TEXT NOT NULL,
    events          TEXT,
    secret          TEXT NOT NULL,
    previous_secret TEXT,
    previous_until  BIGINT,
    enabled         BOOLEAN NOT NULL,
    disabled_reason TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
CREATE INDEX webhook_endpoints_tenant ON webhook_endpoints (tenant, created_at, id);

-- One event to one endpoint: pending until delivered or failed. `next_attempt_at` is when it is due, and while
-- an attempt is in flight the end of that attempt's lease; `claim` fences the claimer's writes. `schedule` is
-- the waits (ms) between attempts, as when it was created.
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    event_id        TEXT NOT NULL,
    endpoint_id     TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL,
    claim           BIGINT NOT NULL,
    next_attempt_at BIGINT NOT NULL,
    schedule        TEXT NOT NULL,
    last_status     INTEGER,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (created_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);

-- Every attempt: in flight from its claim, then delivered, failed (with the next attempt's time) or abandoned
-- (its process stopped; the delivery is tried again).
CREATE TABLE webhook_attempts (
    delivery_id     TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    endpoint_id     TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    started_at      BIGINT NOT NULL,
    finished_at     BIGINT,
    status_code     INTEGER,
    latency_ms      BIGINT,
    error           TEXT,
    next_attempt_at BIGINT,
    PRIMARY KEY (delivery_id, attempt)
);
CREATE INDEX webhook_attempts_endpoint ON webhook_attempts (endpoint_id, started_at, delivery_id, attempt);
