-- Operator actions on workflows (retry, cancel, query the channel, redeliver an event): who, when, what, why and
-- what came of it. Its own table, which no retention pass deletes: the record outlives the workflow's history.
-- Written before the action (result NULL) and completed after it, so that an action whose process died midway
-- is still on the record.
CREATE TABLE audit_log (
    id          TEXT PRIMARY KEY,
    at          BIGINT NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    workflow_id TEXT,
    subject     TEXT,
    tenant      TEXT,
    reason      TEXT,
    status      INTEGER,
    result      TEXT
);
-- A workflow's entries in order (its view, GET /v1/audit?workflow_id=), and the newest of all or of a tenant.
CREATE INDEX audit_log_workflow ON audit_log (workflow_id, at);
CREATE INDEX audit_log_at ON audit_log (at);
