-- The channel's word (issue 31): its notifications and its daily statements, and what reconciling them found.
-- New tables only: nothing of the payment's path reads or writes them.

-- Every verified notification, once per (merchant, id), and every settlement a statement reported for a payment
-- still unknown or processing (source 'statement', id 'statement:<day>:<kind>:<number>'): the channel's word on a
-- charge or refund, kept as evidence and, while `applied_at` is NULL, waiting to be delivered to the workflow
-- that holds the number (`outcome` says what came of it).
CREATE TABLE channel_notifications (
    merchant_id     TEXT NOT NULL,
    notification_id TEXT NOT NULL,
    source          TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    kind            TEXT NOT NULL,
    number          TEXT NOT NULL,
    status          TEXT NOT NULL,
    amount          BIGINT NOT NULL,
    body            TEXT NOT NULL,
    received_at     BIGINT NOT NULL,
    applied_at      BIGINT,
    outcome         TEXT,
    PRIMARY KEY (merchant_id, notification_id)
);
CREATE INDEX channel_notifications_number ON channel_notifications (tenant, kind, number);
-- What is still to deliver: partial, so it holds only the few in flight.
CREATE INDEX channel_notifications_unapplied ON channel_notifications (received_at) WHERE applied_at IS NULL;

-- The copy of a day's statement that reconciliation reads (lines in statement_lines under copy_id), per tenant.
CREATE TABLE statement_copies (
    tenant     TEXT NOT NULL,
    day        TEXT NOT NULL,
    copy_id    TEXT NOT NULL,
    complete   BIGINT NOT NULL,
    line_count BIGINT NOT NULL,
    fetched_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, day)
);

-- A statement's lines, one per entry (a repeated line is the same entry): kept in the database, not in memory,
-- so that a day of millions of lines is matched in batches.
CREATE TABLE statement_lines (
    copy_id TEXT NOT NULL,
    kind    TEXT NOT NULL,
    number  TEXT NOT NULL,
    status  TEXT NOT NULL,
    amount  BIGINT NOT NULL,
    line    TEXT NOT NULL,
    PRIMARY KEY (copy_id, kind, number)
);

-- One reconciliation per (tenant, day): a run again replaces it (run_id points at its exceptions).
CREATE TABLE reconciliations (
    tenant TEXT NOT NULL,
    day    TEXT NOT NULL,
    run_id TEXT NOT NULL,
    state  TEXT NOT NULL,
    ran_at BIGINT NOT NULL,
    counts TEXT NOT NULL,
    PRIMARY KEY (tenant, day)
);

CREATE TABLE reconciliation_exceptions (
    run_id  TEXT NOT NULL,
    kind    TEXT NOT NULL,
    number  TEXT NOT NULL,
    class   TEXT NOT NULL,
    ours    TEXT,
    channel TEXT,
    action  TEXT NOT NULL,
    PRIMARY KEY (run_id, kind, number)
);

-- Copies and runs begun: one that never became current (a run stopped by a crash or the channel going away)
-- is found here and its rows deleted by the next run of its (tenant, day).
CREATE TABLE reconciliation_scratch (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    day        TEXT NOT NULL,
    started_at BIGINT NOT NULL
);
CREATE INDEX reconciliation_scratch_day ON reconciliation_scratch (tenant, day);
