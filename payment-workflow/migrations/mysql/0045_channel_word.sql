-- The channel's word (issue 31): its notifications and its daily statements, and what reconciling them found.
-- New tables only: nothing of the payment's path reads or writes them.

-- Every verified notification, once per (merchant, id), and every settlement a statement reported for a payment
-- still unknown or processing (source 'statement', id 'statement:<day>:<kind>:<number>'): the channel's word on a
-- charge or refund, kept as evidence and, while `applied_at` is NULL, waiting to be delivered to the workflow
-- that holds the number (`outcome` says what came of it).
CREATE TABLE channel_notifications (
    merchant_id     VARCHAR(255) NOT NULL,
    notification_id VARCHAR(255) NOT NULL,
    source          VARCHAR(16) NOT NULL,
    tenant          VARCHAR(255) NOT NULL,
    kind            VARCHAR(16) NOT NULL,
    number          VARCHAR(255) NOT NULL,
    status          VARCHAR(16) NOT NULL,
    amount          BIGINT NOT NULL,
    body            LONGTEXT NOT NULL,
    received_at     BIGINT NOT NULL,
    applied_at      BIGINT,
    outcome         VARCHAR(32),
    PRIMARY KEY (merchant_id, notification_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE INDEX channel_notifications_number ON channel_notifications (tenant, kind, number);
-- What is still to deliver (MySQL has no partial index: NULLs first in this one).
CREATE INDEX channel_notifications_unapplied ON channel_notifications (applied_at, received_at);

-- The copy of a day's statement that reconciliation reads (lines in statement_lines under copy_id), per tenant.
CREATE TABLE statement_copies (
    tenant     VARCHAR(255) NOT NULL,
    day        VARCHAR(10) NOT NULL,
    copy_id    VARCHAR(64) NOT NULL,
    complete   BIGINT NOT NULL,
    line_count BIGINT NOT NULL,
    fetched_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, day)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A statement's lines, one per entry (a repeated line is the same entry): kept in the database, not in memory,
-- so that a day of millions of lines is matched in batches.
CREATE TABLE statement_lines (
    copy_id VARCHAR(64) NOT NULL,
    kind    VARCHAR(16) NOT NULL,
    number  VARCHAR(255) NOT NULL,
    status  VARCHAR(16) NOT NULL,
    amount  BIGINT NOT NULL,
    line    LONGTEXT NOT NULL,
    PRIMARY KEY (copy_id, kind, number)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One reconciliation per (tenant, day): a run again replaces it (run_id points at its exceptions).
CREATE TABLE reconciliations (
    tenant VARCHAR(255) NOT NULL,
    day    VARCHAR(10) NOT NULL,
    run_id VARCHAR(64) NOT NULL,
    state  VARCHAR(16) NOT NULL,
    ran_at BIGINT NOT NULL,
    counts LONGTEXT NOT NULL,
    PRIMARY KEY (tenant, day)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE reconciliation_exceptions (
    run_id  VARCHAR(64) NOT NULL,
    kind    VARCHAR(16) NOT NULL,
    number  VARCHAR(255) NOT NULL,
    class   VARCHAR(32) NOT NULL,
    ours    LONGTEXT,
    channel LONGTEXT,
    action  VARCHAR(16) NOT NULL,
    PRIMARY KEY (run_id, kind, number)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Copies and runs begun: one that never became current (a run stopped by a crash or the channel going away)
-- is found here and its rows deleted by the next run of its (tenant, day).
CREATE TABLE reconciliation_scratch (
    id         VARCHAR(64) PRIMARY KEY,
    tenant     VARCHAR(255) NOT NULL,
    day        VARCHAR(10) NOT NULL,
    started_at BIGINT NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE INDEX reconciliation_scratch_day ON reconciliation_scratch (tenant, day);
