-- The durable-step engine's tables. Times are milliseconds since the Unix epoch (BIGINT), the same on every
-- backend, so that leases and retry waits compare the same way everywhere and tests can inject a clock.
CREATE TABLE workflows (
    workflow_id      TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    input            TEXT NOT NULL,
    input_hash       TEXT NOT NULL,
    state            TEXT NOT NULL,
    output           TEXT,
    error            TEXT,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    lease_epoch      BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT NOT NULL,
    notify           INTEGER NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
-- What the recovery loop scans: only workflows that can still make progress.
CREATE INDEX workflows_due ON workflows (next_attempt_at) WHERE state IN ('running', 'compensating');
CREATE INDEX workflows_state ON workflows (state, created_at);
CREATE INDEX workflows_lease_owner ON workflows (lease_owner) WHERE lease_owner IS NOT NULL;

CREATE TABLE workflow_steps (
    workflow_id TEXT NOT NULL,
    step_key    TEXT NOT NULL,
    step_name   TEXT NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempts    INTEGER NOT NULL,
    output      TEXT,
    error       TEXT,
    started_at  BIGINT NOT NULL,
    finished_at BIGINT,
    PRIMARY KEY (workflow_id, step_key)
);

CREATE TABLE workflow_compensations (
    workflow_id TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    step_key    TEXT NOT NULL,
    name        TEXT NOT NULL,
    input       TEXT NOT NULL,
    status      TEXT NOT NULL,
    PRIMARY KEY (workflow_id, seq)
);
