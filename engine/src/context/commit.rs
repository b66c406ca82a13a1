//! The fenced commit: the pending step rows, the compensation list and the workflow's change, as one call where
//! the store can and no transaction is open, else in the open phase's transaction; and the abort of a phase.

use crate::error::{Error, Interrupt};
use crate::phase::{PhaseCommit, StatementOutcome};
use crate::store::{
    Checkpoint, Fence, Persisted, Store, Tx, WorkflowRecord, WorkflowUpdate, WorkflowWrite, kind, state,
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
            let keep = s.kind == kind::EXTERNAL;
            if !keep {
                history.remove(&s.step_key);
            }
            keep
        });
        self.replay.comps.clone_from(&self.replay.committed_comps);
    }

    /// Commits the pending rows and `update` (and `phase`, if given) as one statement, where the store can and
    /// no transaction is open.
    pub(super) async fn commit_single(
        &mut self,
        update: &WorkflowUpdate,
        phase: Option<PhaseCommit<'_>>,
    ) -> Result<Single, Interrupt> {
        let now = self.core.now();
        let inserting = self.run.insert.as_ref().map(|row| update.applied_to(row, now));
        let checkpoint = self.checkpoint(inserting.as_ref(), update, now);
        let finished = update.state.is_some_and(state::is_final);
        let outputs = match self.core.store.commit_statement(&checkpoint, phase, finished).await? {
            None => return Ok(Single::Unsupported),
            Some(StatementOutcome::GuardFailed) => return Ok(Single::GuardFailed),
            Some(StatementOutcome::LeaseLost) => return Err(Interrupt::LeaseLost),
            Some(StatementOutcome::Duplicate) => return Err(Interrupt::Duplicate),
            Some(StatementOutcome::Done(outputs)) => outputs,
        };
        self.committed();
        Ok(Single::Done(outputs))
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
        let compensations = (self.replay.comps != self.replay.committed_comps).then_some(&self.replay.comps[..]);
        Checkpoint { workflow, steps: &self.run.pending_steps, compensations }
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
        if self.replay.tx.is_none() {
            match self.commit_single(&update, None).await? {
                Single::Done(_) => return Ok(()),
                Single::GuardFailed => {
                    return Err(Interrupt::Engine(Error::Unsupported("guard without a phase".into())));
                }
                Single::Unsupported => {}
            }
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
        match store.persist(&mut tx, &checkpoint).await? {
            Persisted::Duplicate => return Err(Interrupt::Duplicate),
            Persisted::LeaseLost => return Err(Interrupt::LeaseLost),
            Persisted::Done { notify } => {
                if notify && update.state.is_some_and(state::is_final) {
                    store.notify_finished(&mut tx, &self.run.workflow_id).await?;
                }
            }
        }
        tx.commit().await?;
        self.committed();
        Ok(())
    }
}

/// What a single-statement commit came to, seen from the context.
pub(super) enum Single {
    /// Committed, with the phase steps' outputs.
    Done(Vec<Option<String>>),
    /// The phase's guard did not hold: nothing was written.
    GuardFailed,
    /// The store has no single-statement commits: nothing was done.
    Unsupported,
}
