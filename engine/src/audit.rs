//! The audit log of operator actions: each is recorded before it runs and completed with its answer after, so
//! that an action whose process died midway is still on the record (with no answer). Entries live in a table of
//! their own, which the history retention never deletes.

use crate::engine::Engine;
use crate::error::Result;
use crate::store::{AuditFilter, AuditRecord, Store};

/// The most audit entries one read returns.
pub const MAX_AUDIT: i64 = 1000;

/// An operator action about to run, as [`Engine::audit_begin`] records it.
#[derive(Debug, Clone, Default)]
pub struct AuditAction {
    /// Who (an operator key's name, `local`, `cli:<user>`).
    pub actor: String,
    /// What (`retry`, `cancel`, `query_channel`, `redeliver`).
    pub action: String,
    /// The workflow acted on.
    pub workflow_id: Option<String>,
    /// What else it names (an event's id).
    pub subject: Option<String>,
    /// Whose workflow or event it is.
    pub tenant: Option<String>,
    /// Why.
    pub reason: Option<String>,
}

impl<S: Store> Engine<S> {
    /// Records `action` in the audit log, by the engine's clock, before it runs; the entry's id, for
    /// [`Engine::audit_end`].
    pub async fn audit_begin(&self, action: AuditAction) -> Result<String> {
        let record = AuditRecord {
            id: uuid::Uuid::new_v4().simple().to_string(),
            at: self.core.now(),
            actor: action.actor,
            action: action.action,
            workflow_id: action.workflow_id,
            subject: action.subject,
            tenant: action.tenant,
            reason: action.reason,
            status: None,
            result: None,
        };
        self.core.store.insert_audit(&record).await?;
        Ok(record.id)
    }

    /// Completes the audit entry `id` with the action's answer: its HTTP status and what came of it.
    pub async fn audit_end(&self, id: &str, status: u16, result: &str) -> Result<()> {
        self.core.store.finish_audit(id, i32::from(status), result).await
    }

    /// Audit entries: a workflow's, oldest first, or the newest of all; only `tenant`'s when given. `limit` is
    /// bounded to 1–[`MAX_AUDIT`].
    pub async fn audit(&self, workflow_id: Option<&str>, tenant: Option<&str>, limit: i64) -> Result<Vec<AuditRecord>> {
        self.core.store.audit(AuditFilter { workflow_id, tenant, limit: limit.clamp(1, MAX_AUDIT) }).await
    }
}
