//! Operator actions on workflows: reading one with its steps, listing, retrying, cancelling.

use serde::Serialize;

use crate::engine::Engine;
use crate::error::{CANCELLED_CODE, Error, Failure, Result, failure_json};
use crate::store::{
    CompensationRecord, CompensationStatus, Reopen, StepRecord, Store, WorkflowFilter, WorkflowRecord, WorkflowState,
};

/// The most rows one [`Engine::list`] reads.
pub const MAX_LIST: i64 = 1001;

/// A workflow with its steps and compensations, for operators.
#[derive(Debug, Clone, Serialize)]
pub struct WorkflowView {
    /// The workflow.
    pub workflow: WorkflowRecord,
    /// Its steps, in the order they started.
    pub steps: Vec<StepRecord>,
    /// Its registered compensations.
    pub compensations: Vec<CompensationRecord>,
}

impl<S: Store> Engine<S> {
    /// A workflow with its steps and compensations.
    pub async fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowView>> {
        self.workflow_if(workflow_id, |_| true).await
    }

    /// A workflow with its steps and compensations, if `visible` accepts its row: a workflow it refuses is read
    /// as one that does not exist, with no more queries (so its answer takes no longer than a missing one's).
    pub async fn workflow_if(
        &self,
        workflow_id: &str,
        visible: impl FnOnce(&WorkflowRecord) -> bool,
    ) -> Result<Option<WorkflowView>> {
        let Some(workflow) = self.core.store.workflow(workflow_id).await?.filter(|w| visible(w)) else {
            return Ok(None);
        };
        let (steps, compensations) =
            tokio::try_join!(self.core.store.steps(workflow_id), self.core.store.compensations(workflow_id))?;
        Ok(Some(WorkflowView { workflow, steps, compensations }))
    }

    /// Whether the database answers.
    pub async fn ready(&self) -> bool {
        self.core.store.ping().await.is_ok()
    }

    /// Up to `limit` workflows that pass `filter`, newest first (see [`Store::list`]); `limit` is bounded to
    /// 1–[`MAX_LIST`] (a page of 1,000 asks for one row more, to know whether another page follows).
    pub async fn list(&self, filter: WorkflowFilter<'_>, limit: i64) -> Result<Vec<WorkflowRecord>> {
        self.core.store.list(filter, limit.clamp(1, MAX_LIST)).await
    }

    /// Retries a workflow that ended badly: `compensation_failed` runs its compensations again; `failed`
    /// with no compensation done (e.g. a step mismatch) runs forward again from the failed step.
    pub async fn retry(&self, workflow_id: &str) -> Result<WorkflowRecord> {
        let view = self.workflow(workflow_id).await?.ok_or_else(|| Error::NotFound(workflow_id.to_owned()))?;
        let now = self.core.now();
        let (from, how) = match view.workflow.state {
            WorkflowState::CompensationFailed => (WorkflowState::CompensationFailed, Reopen::Compensation),
            WorkflowState::Failed if view.compensations.iter().all(|c| c.status != CompensationStatus::Done) => {
                (WorkflowState::Failed, Reopen::Forward)
            }
            other => {
                return Err(Error::InvalidState {
                    workflow_id: workflow_id.to_owned(),
                    state: other.to_string(),
                    reason: "only compensation_failed workflows, or failed ones with nothing compensated, can be retried",
                });
            }
        };
        self.core.store.reopen(workflow_id, &[from], how, None, now).await?.ok_or_else(|| Error::InvalidState {
            workflow_id: workflow_id.to_owned(),
            state: "changed".to_owned(),
            reason: "the workflow changed state meanwhile",
        })
    }

    /// Cancels a running workflow: any current run is fenced out, the registered compensations run, and the
    /// workflow ends `cancelled`.
    pub async fn cancel(&self, workflow_id: &str) -> Result<WorkflowRecord> {
        let failure = Failure::new(CANCELLED_CODE, "cancelled by an operator");
        let now = self.core.now();
        let reopened = self
            .core
            .store
            .reopen(workflow_id, &[WorkflowState::Running], Reopen::Cancel, Some(failure_json(&failure)), now)
            .await?;
        match reopened {
            Some(record) => Ok(record),
            None => {
                let state =
                    self.core.store.workflow(workflow_id).await?.map(|w| w.state.to_string()).unwrap_or_default();
                Err(Error::InvalidState {
                    workflow_id: workflow_id.to_owned(),
                    state,
                    reason: "only running workflows can be cancelled",
                })
            }
        }
    }
}
