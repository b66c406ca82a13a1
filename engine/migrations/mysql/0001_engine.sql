-- The durable-step engine's tables on MySQL 8 / MariaDB 10.6+. Times are milliseconds since the Unix epoch
-- (BIGINT), as on every backend. Text is utf8mb4 with the binary collation, so ids differing only in case stay
-- distinct. That collation (the one MySQL and MariaDB share) still ignores trailing spaces when comparing: the
-- payment service's keys cannot contain spaces, and engine users must not rely on ids differing only there.
CREATE TABLE workflows (
    workflow_id      VARCHAR(255) NOT NULL PRIMARY KEY,
    name             VARCHAR(255) NOT NULL,
    input            LONGTEXT NOT NULL,
    input_hash       VARCHAR(64) NOT NULL,
    state            VARCHAR(32) NOT NULL,
    output           LONGTEXT,
    error            LONGTEXT,
    lease_owner      VARCHAR(255),
    lease_expires_at BIGINT,
    lease_epoch      BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT NOT NULL,
    notify           BOOLEAN NOT NULL DEFAULT FALSE,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    -- What the recovery loop and heartbeats scan (MySQL has no partial indexes: the state leads instead).
    KEY workflows_due (state, next_attempt_at),
    KEY workflows_state (state, created_at),
    KEY workflows_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE workflow_steps (
    workflow_id VARCHAR(255) NOT NULL,
    step_key    VARCHAR(255) NOT NULL,
    step_name   VARCHAR(255) NOT NULL,
    kind        VARCHAR(32) NOT NULL,
    status      VARCHAR(32) NOT NULL,
    attempts    INT NOT NULL,
    output      LONGTEXT,
    error       LONGTEXT,
    started_at  BIGINT NOT NULL,
    finished_at BIGINT,
    PRIMARY KEY (workflow_id, step_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE workflow_compensations (
    workflow_id VARCHAR(255) NOT NULL,
    seq         INT NOT NULL,
    step_key    VARCHAR(255) NOT NULL,
    name        VARCHAR(255) NOT NULL,
    input       LONGTEXT NOT NULL,
    status      VARCHAR(32) NOT NULL,
    PRIMARY KEY (workflow_id, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
