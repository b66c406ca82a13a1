//! Operator actions on workflows: reading one with its steps (and what it waits for), listing, retrying,
//! cancelling, waking.

use serde::Serialize;

use crate::core::Core;
use crate::engine::Engine;
use crate::error::{CANCELLED_CODE, Error, Failure, Result, failure_json};
use crate::run::{COMPENSATION_PREFIX, drive};
use crate::store::{
    CompensationRecord, CompensationStatus, Reopen, StepKind, StepRecord, StepStatus, Store, WorkflowFilter,
    WorkflowRecord, WorkflowState,
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
    /// Its registered compensations; none once it has completed without an exception and without running any
    /// (they never will).
    pub compensations: Vec<CompensationRecord>,
}

impl WorkflowView {
    /// The external step an unfinished workflow waits on, if any: a call in flight (`started`, or its process
    /// stopped during it: the next attempt finds its outcome out first), one whose outcome is still to be found
    /// out (`unknown`: a timeout, a `processing` answer) or one to be tried again (`retrying`) — its `error` says
    /// why. A compensating workflow waits on its compensations' steps only (the forward call it interrupted is
    /// theirs to settle). The latest such step when several are.
    pub fn waiting_for(&self) -> Option<&StepRecord> {
        if self.workflow.state.is_final() {
            return None;
        }
        let compensating = self.workflow.state == WorkflowState::Compensating;
        self.steps
            .iter()
            .filter(|s| s.kind == StepKind::External)
            .filter(|s| matches!(s.status, StepStatus::Started | StepStatus::Unknown | StepStatus::Retrying))
            .filter(|s| !compensating || s.step_key.starts_with(COMPENSATION_PREFIX))
            .max_by_key(|s| (s.started_at, s.step_key.clone()))
    }
}

/// What [`Engine::wake`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Woken {
    /// A run of this process drives the workflow: its wait before the next attempt ends now (or, during a
    /// call, the wait after it).
    Running,
    /// Claimed by this process and run now.
    Claimed,
    /// Another live process holds its lease and runs it: nothing is taken from it (that would fence its run
    /// and ask the channel twice). A run waits in-process only up to `max_inline_wait`, and releases the
    /// workflow for longer waits, so its next attempt comes soon; wake it again then.
    HeldElsewhere,
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

    /// Runs a running or compensating workflow now, whatever it waits for: "ask again now" (an operator's
    /// `query-channel`; later, a signal from outside such as a channel's notification). A run of this process
    /// that drives it has its wait cut short; a workflow no live process holds (released for a persisted wait,
    /// or its lease ended, or its lease this process's own with no run here) is claimed and run here at once;
    /// one another live process holds is left to it ([`Woken::HeldElsewhere`]). Its next attempt finds out what
    /// its previous ones did before acting again, as after any wait.
    pub async fn wake(&self, workflow_id: &str) -> Result<Woken> {
        if let Some(woken) = self.core.woken(workflow_id) {
            woken.notify_one();
            return Ok(Woken::Running);
        }
        if self.core.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        let not_open = |record: &WorkflowRecord| Error::InvalidState {
            workflow_id: workflow_id.to_owned(),
            state: record.state.to_string(),
            reason: "only running or compensating workflows can be woken",
        };
        let record =
            self.core.store.workflow(workflow_id).await?.ok_or_else(|| Error::NotFound(workflow_id.to_owned()))?;
        if record.state.is_final() {
            return Err(not_open(&record));
        }
        let wf = self.registry.get(record.name.as_str()).cloned().ok_or(Error::UnknownWorkflowType(record.name))?;
        match self.core.store.claim(workflow_id, &self.core.owner, self.core.lease()).await? {
            Some(claimed) => {
                tracing::info!(%workflow_id, state = %claimed.state, "workflow woken: run now");
                let run = Core::<S>::drive_here(
                    &mut self.core.running(),
                    &self.core.next_run,
                    workflow_id,
                    &claimed.input_hash,
                );
                tokio::spawn(drive(self.core.clone(), wf, claimed, run, false, None));
                Ok(Woken::Claimed)
            }
            None => {
                // Claimed meanwhile by this process's own recovery loop, or ended.
                if let Some(woken) = self.core.woken(workflow_id) {
                    woken.notify_one();
                    return Ok(Woken::Running);
                }
                match self.core.store.workflow(workflow_id).await? {
                    Some(record) if record.state.is_final() => Err(not_open(&record)),
                    Some(_) => Ok(Woken::HeldElsewhere),
                    None => Err(Error::NotFound(workflow_id.to_owned())),
                }
            }
        }
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
