//! The fenced commit: the pending step rows, the compensation list and the workflow's change, as one call where
//! the store can and no transaction is open, else in the open phase's transaction; and the abort of a phase.

use crate::error::{Error, Interrupt};
use crate::phase::PhaseCommit;
use crate::store::{
    Checkpoint, Committed, CompensationStatus, Fence, StepKind, Store, Tx, WorkflowRecord, WorkflowState,
    WorkflowUpdate, WorkflowWrite,
};

use super::WorkflowContext;

impl<S: Store> WorkflowContext<S> {
    pub(super) async fn open_tx(&mut self) -> Result<&mut Tx<S>, Interrupt> {
        if self.replay.tx.is_none() {
            self.replay.tx = Some(self.core.store.begin().await?);
        }
        self.replay.tx.as_mut().ok_or(Interrupt::LeaseLost)
    }

    /// Rolls back the open phase: its transactional steps and their compensations are forgotten; outcomes of
    /// external steps are kept for the next commit.
    pub(crate) async fn abort_phase(&mut self) {
        self.replay.deferred = None;
        if let Some(tx) = self.replay.tx.take() {
            let _ = tx.rollback().await;
        }
        let history = &mut self.replay.history;
        self.run.pending_steps.retain(|s| {
            let keep = s.kind == StepKind::External;
            if !keep {
                history.remove(&s.step_key);
            }
            keep
        });
        self.replay.comps.clone_from(&self.replay.committed_comps);
    }

    /// Commits the pending rows and `update` (and `phase`, if given) as one call, where the store can and
    /// no transaction is open: see [`Store::commit_in_one_call`] (`None`: the store cannot, nothing was done). The
    /// commit is recorded as such only when `Done`.
    pub(super) async fn commit_in_one_call(
        &mut self,
        update: &WorkflowUpdate,
        phase: Option<PhaseCommit<'_>>,
    ) -> Result<Option<Committed>, Interrupt> {
        let now = self.core.now();
        let inserting = self.run.insert.as_ref().map(|row| update.applied_to(row, now));
        let checkpoint = self.checkpoint(inserting.as_ref(), update, now);
        let finished = update.state.is_some_and(WorkflowState::is_final);
        let outcome = self.core.store.commit_in_one_call(&checkpoint, phase, finished).await?;
        if let Some(Committed::Done { .. }) = outcome {
            self.committed();
        }
        Ok(outcome)
    }

    /// A commit's bookkeeping applying `update`: the pending rows, and the fence — or, on the first commit,
    /// `inserting` (the workflow row as this commit leaves it; no fence, the epoch is ours).
    pub(super) fn checkpoint<'a>(
        &'a self,
        inserting: Option<&'a WorkflowRecord>,
        update: &'a WorkflowUpdate,
        now: i64,
    ) -> Checkpoint<'a> {
        let workflow = match inserting {
            Some(row) => WorkflowWrite::Insert(row),
            None => {
                WorkflowWrite::Fence(Fence { workflow_id: &self.run.workflow_id, epoch: self.run.epoch, update, now })
            }
        };
        // A workflow that completes, plainly, with none of its compensations run can never run them (only a
        // failure or a cancel compensates, and a completed workflow has neither): its list is not kept. The
        // completing commit writes the row again, so it would be stored twice — a payment's four cost ~380
        // bytes a version. One that completes with an exception (rolled forward) keeps it, for the operator.
        let never_run = update.state == Some(WorkflowState::Completed)
            && update.error.is_none()
            && self.replay.comps.iter().all(|c| c.status == CompensationStatus::Registered);
        let compensations = if never_run {
            (!self.replay.committed_comps.is_empty()).then_some(&[][..])
        } else {
            (self.replay.comps != self.replay.committed_comps).then_some(&self.replay.comps[..])
        };
        let leases_by_database = self.core.clock.leases_by_database();
        Checkpoint { workflow, steps: &self.run.pending_steps, compensations, leases_by_database }
    }

    /// After a commit: nothing is pending, and a start waiting for the first commit hears of it.
    pub(super) fn committed(&mut self) {
        self.run.insert = None;
        self.run.pending_steps.clear();
        self.replay.committed_comps.clone_from(&self.replay.comps);
        if let Some(started) = self.run.first_commit.take() {
            let _ = started.send(Ok(true));
        }
    }

    /// Commits the open phase (or a new transaction) with the pending step and compensation rows and
    /// `update`, fenced by the lease epoch.
    pub(crate) async fn commit(&mut self, update: WorkflowUpdate) -> Result<(), Interrupt> {
        if let Some(phase) = self.replay.deferred.take() {
            self.run_phase(&phase, &update).await?;
            return Ok(());
        }
        if self.replay.tx.is_none()
            && let Some(outcome) = self.commit_in_one_call(&update, None).await?
        {
            written(outcome)?;
            return Ok(());
        }
        let now = self.core.now();
        let store = self.core.store.clone();
        self.open_tx().await?;
        let Some(mut tx) = self.replay.tx.take() else {
            return Err(Interrupt::LeaseLost);
        };
        // From here an early return drops (rolls back) the transaction. Before the first commit nothing has
        // left the database (an external step commits its intent first), so a duplicate undoes everything.
        let inserting = self.run.insert.as_ref().map(|row| update.applied_to(row, now));
        let checkpoint = self.checkpoint(inserting.as_ref(), &update, now);
        let notify = written(store.persist(&mut tx, &checkpoint).await?)?;
        if notify && update.state.is_some_and(WorkflowState::is_final) {
            store.notify_finished(&mut tx, &self.run.workflow_id).await?;
        }
        tx.commit().await?;
        self.committed();
        Ok(())
    }
}

/// The outcome of a commit without a statement phase: when written, whether to tell waiters elsewhere (see
/// [`Committed::Done`]); else the interrupt of its refusal. Such a commit has no guard, so a failed one is the
/// engine's error (a phase's outcome is read by `run_phase`).
fn written(outcome: Committed) -> Result<bool, Interrupt> {
    match outcome {
        Committed::Done { notify, .. } => Ok(notify),
        Committed::LeaseLost => Err(Interrupt::LeaseLost),
        Committed::Duplicate => Err(Interrupt::Duplicate),
        Committed::GuardFailed => Err(Interrupt::Engine(Error::Unsupported("guard without a phase".into()))),
    }
}
