//! Which workflows a page of [`super::Store::list`] holds: keyset pagination, newest first, on
//! `(created_at, workflow_id)`, filtered by tenant and state in the query.

/// A position in the list order: a page holds the workflows strictly after it, i.e. created earlier, or in the
/// same millisecond with a smaller id. Unlike a time alone, it names one row, so rows sharing a millisecond are
/// neither skipped nor repeated from page to page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last listed workflow's creation time (ms since the epoch).
    pub created_at: i64,
    /// The last listed workflow's id.
    pub workflow_id: String,
}

impl Cursor {
    /// The position before every workflow created at `before_ms` or later (the `before` of older clients): an
    /// empty id sorts before every id.
    pub fn before_time(before_ms: i64) -> Self {
        Self { created_at: before_ms, workflow_id: String::new() }
    }

    /// The position of `workflow`, the last of a page: where the next page starts.
    pub fn after(workflow: &super::WorkflowRecord) -> Self {
        Self { created_at: workflow.created_at, workflow_id: workflow.workflow_id.clone() }
    }
}

/// The filters of a list: each one a condition of the query, so a page is full whenever rows remain.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkflowFilter<'a> {
    /// Only this tenant's workflows (`workflows.tenant`); `None`: every workflow, with a tenant or not.
    pub tenant: Option<&'a str>,
    /// Only workflows in this state.
    pub state: Option<super::WorkflowState>,
    /// Only workflows after this position (the previous page's last).
    pub after: Option<&'a Cursor>,
    /// Only workflows of this type ([`crate::Workflow::NAME`]): a condition on the rows the index range reads
    /// (no index leads with it; a deployment runs few types, each common).
    pub name: Option<&'a str>,
}
