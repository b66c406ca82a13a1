//! The audit log's rows: operator actions on workflows, kept apart from the workflows (no retention pass deletes
//! them), as Rust sees them.

use serde::Serialize;

/// One operator action as the audit log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct AuditRecord {
    /// Unique id of the entry.
    pub id: String,
    /// When the action was asked for (ms since the epoch).
    pub at: i64,
    /// Who: an operator key's name, `local` (the zero-configuration mode), `cli:<user>` (the terminal).
    pub actor: String,
    /// What: `retry`, `cancel`, `query_channel`, `redeliver`.
    pub action: String,
    /// The workflow acted on, if the action has one.
    pub workflow_id: Option<String>,
    /// What else it names (an event's id for a redelivery).
    pub subject: Option<String>,
    /// The tenant whose workflow or event it is, when known (a tenant reads only its own entries).
    pub tenant: Option<String>,
    /// Why, as the operator said.
    pub reason: Option<String>,
    /// The answer's HTTP status; `None` while the action runs, or when its process died before it answered.
    pub status: Option<i32>,
    /// What came of it, in words (the workflow's new state, or the refusal's code and detail).
    pub result: Option<String>,
}

/// Which audit entries to read.
#[derive(Debug, Clone, Copy)]
pub struct AuditFilter<'a> {
    /// One workflow's entries, oldest first; `None`: the newest entries of all.
    pub workflow_id: Option<&'a str>,
    /// Only this tenant's.
    pub tenant: Option<&'a str>,
    /// At most this many.
    pub limit: i64,
}
