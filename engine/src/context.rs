//! The context a workflow body runs its steps through: replay of finished steps, atomic phases, intents and
//! outcomes of external steps, compensation registration, and the fenced commit.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::engine::{Core, StartSignal};
use crate::error::{Error, Failure, Interrupt, StepError, is_transient};
use crate::phase::{PhaseCommit, PhaseRow, PhaseStep, StatementOutcome, StatementPhase};
use crate::step::{Attempt, Previous, StepSpec};
use crate::store::{
    Checkpoint, CompensationRecord, Conn, Fence, Persisted, StepRecord, Store, Tx, WorkflowRecord, WorkflowUpdate,
    compensation_status, kind, state, step_status,
};
use crate::workflow::BoxFuture;

/// What a workflow body runs its steps through.
///
/// Consecutive transactional steps share one transaction (an *atomic phase*) that commits, with every step's
/// row and the workflow's progress, at the next external step, wait or end of the workflow. A transactional
/// step that fails rolls back its whole phase.
pub struct WorkflowContext<S: Store> {
    core: Arc<Core<S>>,
    workflow_id: String,
    input: String,
    epoch: i64,
    /// The workflow row, while it is not yet in the database: it is inserted by the first commit, whose
    /// transaction rolls back (and the run stops as a duplicate) if another start inserted it first.
    insert: Option<WorkflowRecord>,
    /// Committed steps, and the uncommitted ones of the open phase.
    history: HashMap<String, StepRecord>,
    tx: Option<Tx<S>>,
    pending_steps: Vec<StepRecord>,
    /// The workflow's compensations as this run sees them: the committed ones, and those registered (or whose
    /// status changed) since. Each commit that changes them writes the whole list (the lease makes this run
    /// its only writer).
    comps: Vec<CompensationRecord>,
    /// The compensations as last committed, which an aborted phase returns to.
    committed_comps: Vec<CompensationRecord>,
    prefix: String,
    tx_attempts: HashMap<String, u32>,
    first_commit: Option<StartSignal>,
    /// A statement phase left for the workflow's completing commit ([`WorkflowContext::finish_with`]).
    deferred: Option<StatementPhase>,
    /// External steps whose first attempt's intent a statement phase of this run committed.
    fresh_intents: HashSet<String>,
}

impl<S: Store> WorkflowContext<S> {
    pub(crate) fn new(
        core: Arc<Core<S>>,
        record: &WorkflowRecord,
        insert: bool,
        steps: Vec<StepRecord>,
        comps: &[CompensationRecord],
        first_commit: Option<StartSignal>,
    ) -> Self {
        Self {
            core,
            workflow_id: record.workflow_id.clone(),
            input: record.input.clone(),
            epoch: record.lease_epoch,
            insert: insert.then(|| record.clone()),
            history: steps.into_iter().map(|s| (s.step_key.clone(), s)).collect(),
            tx: None,
            pending_steps: Vec::new(),
            comps: comps.to_vec(),
            committed_comps: comps.to_vec(),
            prefix: String::new(),
            tx_attempts: HashMap::new(),
            first_commit,
            deferred: None,
            fresh_intents: HashSet::new(),
        }
    }

    /// The workflow's input, decoded (compensations read it here rather than storing copies of it).
    pub fn input<T: DeserializeOwned>(&self) -> Result<T, Interrupt> {
        serde_json::from_str(&self.input)
            .map_err(|e| Interrupt::Failed(Failure::new("invalid_input", format!("stored input does not decode: {e}"))))
    }

    /// The id of the running workflow.
    pub fn workflow_id(&self) -> &str {
        &self.workflow_id
    }

    /// The row of step `key` (without the compensation prefix), committed or in the open phase.
    pub(crate) fn step(&self, key: &str) -> Option<&StepRecord> {
        self.history.get(key)
    }

    /// Now, by the engine's clock (milliseconds since the epoch).
    pub fn now_ms(&self) -> i64 {
        self.core.now()
    }

    /// Runs a transactional step: `f` gets the workflow's open transaction, and its writes commit together
    /// with the step's row, exactly once. A finished step returns its stored output without running.
    ///
    /// `Err(StepError::Terminal)` fails the workflow; retryable and database errors replay the body from the
    /// last commit after the step's retry wait, until its attempts are used up.
    pub async fn transactional<T, F>(&mut self, spec: impl Into<StepSpec>, f: F) -> Result<T, Interrupt>
    where
        T: Serialize + DeserializeOwned + Send,
        F: for<'c> FnOnce(&'c mut Conn<S>) -> BoxFuture<'c, Result<T, StepError>> + Send,
    {
        let spec = spec.into();
        let key = format!("{}{}", self.prefix, spec.key);
        if let Some(done) = self.replay(&key, &spec.name, kind::TRANSACTIONAL)? {
            return done;
        }
        self.check_shutdown()?;
        let now = self.core.now();
        let tx = self.open_tx().await?;
        let result = f(&mut **tx).await;
        let attempts = self.tx_attempts.get(&key).copied().unwrap_or(0) + 1;
        let row = |status: &str, output: Option<String>, error: Option<String>| StepRecord {
            workflow_id: String::new(),
            step_key: key.clone(),
            step_name: spec.name.clone(),
            kind: kind::TRANSACTIONAL.to_owned(),
            status: status.to_owned(),
            attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
            output,
            error,
            started_at: now,
            finished_at: Some(now),
        };
        match result {
            Ok(value) => {
                let output = serde_json::to_string(&value).map_err(|e| Interrupt::Engine(e.into()))?;
                // Registered once the step has decided, in its phase: rolled back with it.
                if let Some((name, input)) = &spec.compensation {
                    self.register_compensation(&key, name, input)?;
                }
                self.push_step(row(step_status::COMPLETED, Some(output), None));
                Ok(value)
            }
            Err(StepError::Terminal(failure)) => {
                self.abort_phase().await;
                self.push_step(row(step_status::FAILED, None, Some(failure_json(&failure))));
                Err(Interrupt::Failed(failure))
            }
            Err(StepError::Database(e)) if is_transient(&e) => {
                // A deadlock or lock timeout undid the whole phase: not another attempt of this step. The run
                // replays it like a commit that met one (see `run::drive`).
                self.abort_phase().await;
                Err(Interrupt::Engine(e.into()))
            }
            Err(e @ (StepError::Retryable(_) | StepError::UnknownOutcome(_) | StepError::Database(_))) => {
                self.abort_phase().await;
                self.tx_attempts.insert(key.clone(), attempts);
                match spec.retry.delay_after(attempts) {
                    Some(delay) => Err(Interrupt::Retry { delay_ms: millis(delay) }),
                    None => {
                        let failure = Failure::new("retries_exhausted", format!("step {key}: {e}"));
                        self.push_step(row(step_status::FAILED, None, Some(failure_json(&failure))));
                        Err(Interrupt::Failed(failure))
                    }
                }
            }
        }
    }

    /// Runs an external step (a call outside the database). Its intent commits before each attempt and its
    /// outcome commits with the next commit; an attempt after a crash or an unknown outcome is told so through
    /// [`Attempt::previous`] and must find out what happened before acting again.
    ///
    /// Retryable errors wait by the step's policy (in-process when short, persisted when long) until its
    /// attempts are used up; unknown outcomes are retried at most every `max_interval`, never given up.
    pub async fn external<T, F, Fut>(&mut self, spec: impl Into<StepSpec>, mut f: F) -> Result<T, Interrupt>
    where
        T: Serialize + DeserializeOwned + Send,
        F: FnMut(Attempt) -> Fut + Send,
        Fut: Future<Output = Result<T, StepError>> + Send,
    {
        let spec = spec.into();
        let key = format!("{}{}", self.prefix, spec.key);
        if let Some(done) = self.replay(&key, &spec.name, kind::EXTERNAL)? {
            return done;
        }
        // A statement phase just committed this step's first intent: attempt 1 starts from it.
        let mut intent_committed = self.fresh_intents.remove(&key);
        let (mut attempts, mut previous, started_at) = match self.history.get(&key) {
            Some(s) if intent_committed => (0, Previous::None, s.started_at),
            Some(s) => (
                u32::try_from(s.attempts).unwrap_or(0),
                match s.status.as_str() {
                    step_status::RETRYING => Previous::Failed(s.error.clone().unwrap_or_default()),
                    _ => Previous::Unknown,
                },
                s.started_at,
            ),
            None => (0, Previous::None, self.core.now()),
        };
        if let Some((name, input)) = &spec.compensation {
            self.register_compensation(&key, name, input)?;
        }
        let row = |status: &str, attempts: u32, output: Option<String>, error: Option<String>, done: Option<i64>| {
            StepRecord {
                workflow_id: String::new(),
                step_key: key.clone(),
                step_name: spec.name.clone(),
                kind: kind::EXTERNAL.to_owned(),
                status: status.to_owned(),
                attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
                output,
                error,
                started_at,
                finished_at: done,
            }
        };
        loop {
            self.check_shutdown()?;
            attempts += 1;
            if !std::mem::take(&mut intent_committed) {
                self.push_step(row(step_status::STARTED, attempts, None, None, None));
                self.commit(WorkflowUpdate::default()).await?;
            }
            let result = f(Attempt { number: attempts, previous: previous.clone() }).await;
            let now = self.core.now();
            let (status, message, delay) = match result {
                Ok(value) => {
                    let output = serde_json::to_string(&value).map_err(|e| Interrupt::Engine(e.into()))?;
                    self.push_step(row(step_status::COMPLETED, attempts, Some(output), None, Some(now)));
                    return Ok(value);
                }
                Err(StepError::Terminal(failure)) => {
                    self.push_step(row(step_status::FAILED, attempts, None, Some(failure_json(&failure)), Some(now)));
                    return Err(Interrupt::Failed(failure));
                }
                Err(StepError::UnknownOutcome(m)) => (step_status::UNKNOWN, m, spec.retry.delay_unbounded(attempts)),
                Err(e @ (StepError::Retryable(_) | StepError::Database(_))) => match spec.retry.delay_after(attempts) {
                    Some(delay) => (step_status::RETRYING, e.to_string(), delay),
                    None => {
                        let failure = Failure::new("retries_exhausted", format!("step {key}: {e}"));
                        let error = Some(failure_json(&failure));
                        self.push_step(row(step_status::FAILED, attempts, None, error, Some(now)));
                        return Err(Interrupt::Failed(failure));
                    }
                },
            };
            tracing::debug!(workflow_id = %self.workflow_id, step_key = %key, attempts, %message, "step will retry");
            previous =
                if status == step_status::UNKNOWN { Previous::Unknown } else { Previous::Failed(message.clone()) };
            self.push_step(row(status, attempts, None, Some(message), None));
            self.wait(delay).await?;
        }
    }

    /// Runs a statement phase: its transactional steps (see [`StatementPhase`]) and the commit they end with, as
    /// one call where the store can (Postgres: one statement, one round trip; SQLite: one call to the writer).
    /// Returns each step's output, `None` for a step whose condition did not hold and for an external step's
    /// intent. A phase that already committed
    /// returns its stored outputs; an open phase of closure steps commits first. Only for stores with
    /// single-statement commits: elsewhere it fails the run (build phases only where the store has them).
    pub async fn statement_phase(&mut self, phase: StatementPhase) -> Result<Vec<Option<Value>>, Interrupt> {
        if let Some(outputs) = self.replay_phase(&phase)? {
            return Ok(outputs);
        }
        self.check_shutdown()?;
        if self.tx.is_some() {
            self.commit(WorkflowUpdate::default()).await?;
        }
        self.run_phase(&phase, &WorkflowUpdate::default()).await
    }

    /// Defers the statement phase `phase` to the commit that completes the workflow, and returns `output`, which
    /// the body must return at once: the phase's steps, the workflow's end and its output are then written by
    /// one statement. If the phase's guard does not hold there, the workflow fails with the guard's failure
    /// (and compensates) instead of completing.
    pub async fn finish_with<T>(&mut self, phase: StatementPhase, output: T) -> Result<T, Interrupt> {
        if self.replay_phase(&phase)?.is_some() {
            return Ok(output);
        }
        self.check_shutdown()?;
        if self.tx.is_some() {
            self.commit(WorkflowUpdate::default()).await?;
        }
        self.deferred = Some(phase);
        Ok(output)
    }

    /// A phase's stored outputs, if it committed before.
    fn replay_phase(&self, phase: &StatementPhase) -> Result<Option<Vec<Option<Value>>>, Interrupt> {
        let keys = phase.keys(&self.prefix);
        let steps = keys.iter().zip(&phase.steps).filter(|(_, s)| !s.intent);
        if !steps.clone().any(|(k, _)| self.history.contains_key(k)) {
            return Ok(None);
        }
        let mut outputs = Vec::new();
        for (key, step) in keys.iter().zip(&phase.steps) {
            if step.intent {
                outputs.push(None);
                continue;
            }
            outputs.push(match self.replay::<Value>(key, &step.spec.name, kind::TRANSACTIONAL)? {
                Some(done) => Some(done?),
                None if self.history.contains_key(key) => {
                    return Err(Interrupt::Engine(Error::Interrupted(format!("step {key} is unfinished"))));
                }
                None => None,
            });
        }
        Ok(Some(outputs))
    }

    /// Commits `phase` with the pending rows and `update` as one statement; records its steps.
    async fn run_phase(
        &mut self,
        phase: &StatementPhase,
        update: &WorkflowUpdate,
    ) -> Result<Vec<Option<Value>>, Interrupt> {
        for step in &phase.steps {
            if let Some((name, input)) = &step.spec.compensation {
                let key = format!("{}{}", self.prefix, step.spec.key);
                self.register_compensation(&key, name, input)?;
            }
        }
        let now = self.core.now();
        let keys = phase.keys(&self.prefix);
        let rows: Vec<PhaseRow<'_>> = keys
            .iter()
            .zip(&phase.steps)
            .map(|(key, step)| PhaseRow {
                key: key.clone(),
                name: &step.spec.name,
                kind: if step.intent { kind::EXTERNAL } else { kind::TRANSACTIONAL },
                status: if step.intent { step_status::STARTED } else { step_status::COMPLETED },
                attempts: i32::try_from(self.tx_attempts.get(key).copied().unwrap_or(0) + 1).unwrap_or(i32::MAX),
                output: &step.output,
                finished: !step.intent,
                when: step.when.as_deref(),
            })
            .collect();
        let result = self.commit_single(update, Some(PhaseCommit { phase, rows: &rows, now })).await;
        drop(rows);
        let outputs = match result {
            Ok(Single::Done(outputs)) => outputs,
            Ok(Single::GuardFailed) if self.insert.is_some() => {
                // The workflow's first commit: nothing of it exists, so it was never started.
                self.abort_phase().await;
                return Err(Interrupt::Refused(phase.guard_failure()));
            }
            Ok(Single::GuardFailed) => {
                self.abort_phase().await;
                let failure = phase.guard_failure();
                if let (Some(key), Some(first)) = (keys.first(), phase.steps.first()) {
                    let error = Some(failure_json(&failure));
                    let failed = StepRecord {
                        status: step_status::FAILED.to_owned(),
                        error,
                        ..self.phase_record(key, first, now)
                    };
                    self.push_step(failed);
                }
                return Err(Interrupt::Failed(failure));
            }
            Ok(Single::Unsupported) => {
                self.abort_phase().await;
                let backend = self.core.store.backend();
                return Err(Interrupt::Engine(Error::Unsupported(format!("statement phases on {backend}"))));
            }
            Err(e) => {
                self.abort_phase().await;
                return Err(e);
            }
        };
        let mut values = Vec::new();
        for ((key, step), output) in keys.into_iter().zip(&phase.steps).zip(outputs) {
            if step.intent {
                values.push(None);
                // Written only if its condition held: the body's next call of the external step starts from it.
                if output.is_some() {
                    let intent = StepRecord {
                        kind: kind::EXTERNAL.to_owned(),
                        status: step_status::STARTED.to_owned(),
                        finished_at: None,
                        ..self.phase_record(&key, step, now)
                    };
                    self.history.insert(key.clone(), intent);
                    self.fresh_intents.insert(key);
                }
                continue;
            }
            let Some(output) = output else {
                values.push(None);
                continue;
            };
            values.push(Some(serde_json::from_str(&output).map_err(|e| Interrupt::Engine(e.into()))?));
            let completed = StepRecord { output: Some(output), ..self.phase_record(&key, step, now) };
            self.history.insert(key, completed);
        }
        Ok(values)
    }

    /// A phase step's row as the statement wrote it (transactional, completed, no output yet).
    fn phase_record(&self, key: &str, step: &PhaseStep, now: i64) -> StepRecord {
        StepRecord {
            workflow_id: self.workflow_id.clone(),
            step_key: key.to_owned(),
            step_name: step.spec.name.clone(),
            kind: kind::TRANSACTIONAL.to_owned(),
            status: step_status::COMPLETED.to_owned(),
            attempts: 1,
            output: None,
            error: None,
            started_at: now,
            finished_at: Some(now),
        }
    }

    /// Waits `delay` before the next attempt: asleep in-process when short, otherwise (or when the engine
    /// shuts down meanwhile) persisted as the workflow's `next_attempt_at` with the lease released.
    async fn wait(&mut self, delay: Duration) -> Result<(), Interrupt> {
        if delay <= self.core.config.max_inline_wait {
            tokio::select! {
                () = tokio::time::sleep(delay) => return Ok(()),
                () = self.core.shutdown.cancelled() => {}
            }
        }
        let until_ms = self.core.now() + i64::try_from(millis(delay)).unwrap_or(i64::MAX / 2);
        self.commit(WorkflowUpdate { release_until: Some(until_ms), ..WorkflowUpdate::default() }).await?;
        Err(Interrupt::Suspended { until_ms })
    }

    /// Looks a step up in the history: its stored outcome when it finished, `None` when it must run.
    #[allow(clippy::type_complexity)]
    fn replay<T: DeserializeOwned>(
        &self,
        key: &str,
        name: &str,
        kind: &str,
    ) -> Result<Option<Result<T, Interrupt>>, Interrupt> {
        let Some(s) = self.history.get(key) else {
            return Ok(None);
        };
        if s.step_name != name || s.kind != kind {
            return Err(Interrupt::StepMismatch {
                step_key: key.to_owned(),
                stored: format!("{} ({})", s.step_name, s.kind),
                now: format!("{name} ({kind})"),
            });
        }
        match s.status.as_str() {
            step_status::COMPLETED => {
                let output = s.output.as_deref().unwrap_or("null");
                Ok(Some(serde_json::from_str(output).map_err(|e| Interrupt::Engine(e.into()))))
            }
            step_status::FAILED => Ok(Some(Err(Interrupt::Failed(parse_failure(s.error.as_deref()))))),
            _ => Ok(None),
        }
    }

    fn check_shutdown(&self) -> Result<(), Interrupt> {
        if self.core.shutdown.is_cancelled() { Err(Interrupt::Shutdown) } else { Ok(()) }
    }

    fn register_compensation(&mut self, key: &str, name: &str, input: &serde_json::Value) -> Result<(), Interrupt> {
        if self.comps.iter().any(|c| c.step_key == key) {
            return Ok(());
        }
        let seq = self.comps.iter().map(|c| c.seq + 1).max().unwrap_or(0);
        self.comps.push(CompensationRecord {
            workflow_id: self.workflow_id.clone(),
            seq,
            step_key: key.to_owned(),
            name: name.to_owned(),
            input: serde_json::to_string(input).map_err(|e| Interrupt::Engine(e.into()))?,
            status: compensation_status::REGISTERED.to_owned(),
        });
        Ok(())
    }

    fn push_step(&mut self, mut row: StepRecord) {
        row.workflow_id.clone_from(&self.workflow_id);
        self.history.insert(row.step_key.clone(), row.clone());
        match self.pending_steps.iter_mut().find(|s| s.step_key == row.step_key) {
            Some(slot) => *slot = row,
            None => self.pending_steps.push(row),
        }
    }

    pub(crate) fn push_compensation_status(&mut self, mut comp: CompensationRecord, status: &str) {
        comp.status = status.to_owned();
        match self.comps.iter_mut().find(|c| c.seq == comp.seq) {
            Some(slot) => *slot = comp,
            None => self.comps.push(comp),
        }
    }

    pub(crate) fn set_prefix(&mut self, prefix: String) {
        self.prefix = prefix;
    }

    async fn open_tx(&mut self) -> Result<&mut Tx<S>, Interrupt> {
        if self.tx.is_none() {
            self.tx = Some(self.core.store.begin().await?);
        }
        self.tx.as_mut().ok_or(Interrupt::LeaseLost)
    }

    /// Rolls back the open phase: its transactional steps and their compensations are forgotten; outcomes of
    /// external steps are kept for the next commit.
    pub(crate) async fn abort_phase(&mut self) {
        self.deferred = None;
        if let Some(tx) = self.tx.take() {
            let _ = tx.rollback().await;
        }
        let history = &mut self.history;
        self.pending_steps.retain(|s| {
            let keep = s.kind == kind::EXTERNAL;
            if !keep {
                history.remove(&s.step_key);
            }
            keep
        });
        self.comps.clone_from(&self.committed_comps);
    }

    /// Commits the pending rows and `update` (and `phase`, if given) as one statement, where the store can and
    /// no transaction is open.
    async fn commit_single(
        &mut self,
        update: &WorkflowUpdate,
        phase: Option<PhaseCommit<'_>>,
    ) -> Result<Single, Interrupt> {
        let now = self.core.now();
        let inserting = self.insert.as_ref().map(|row| update.applied_to(row, now));
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
    fn checkpoint<'a>(
        &'a self,
        inserting: Option<&'a WorkflowRecord>,
        update: &'a WorkflowUpdate,
        now: i64,
    ) -> Checkpoint<'a> {
        let fence =
            inserting.is_none().then_some(Fence { workflow_id: &self.workflow_id, epoch: self.epoch, update, now });
        let compensations = (self.comps != self.committed_comps).then_some(&self.comps[..]);
        Checkpoint { insert: inserting, steps: &self.pending_steps, compensations, fence }
    }

    /// After a commit: nothing is pending, and a start waiting for the first commit hears of it.
    fn committed(&mut self) {
        self.insert = None;
        self.pending_steps.clear();
        self.committed_comps.clone_from(&self.comps);
        if let Some(started) = self.first_commit.take() {
            let _ = started.send(Ok(true));
        }
    }

    /// Commits the open phase (or a new transaction) with the pending step and compensation rows and
    /// `update`, fenced by the lease epoch.
    pub(crate) async fn commit(&mut self, update: WorkflowUpdate) -> Result<(), Interrupt> {
        if let Some(phase) = self.deferred.take() {
            self.run_phase(&phase, &update).await?;
            return Ok(());
        }
        if self.tx.is_none() {
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
        let Some(mut tx) = self.tx.take() else {
            return Err(Interrupt::LeaseLost);
        };
        // From here an early return drops (rolls back) the transaction. Before the first commit nothing has
        // left the database (an external step commits its intent first), so a duplicate undoes everything.
        let inserting = self.insert.as_ref().map(|row| update.applied_to(row, now));
        let checkpoint = self.checkpoint(inserting.as_ref(), &update, now);
        match store.persist(&mut tx, &checkpoint).await? {
            Persisted::Duplicate => return Err(Interrupt::Duplicate),
            Persisted::LeaseLost => return Err(Interrupt::LeaseLost),
            Persisted::Done { notify } => {
                if notify && update.state.is_some_and(state::is_final) {
                    store.notify_finished(&mut tx, &self.workflow_id).await?;
                }
            }
        }
        tx.commit().await?;
        self.committed();
        Ok(())
    }

    pub(crate) fn core(&self) -> &Core<S> {
        &self.core
    }

    pub(crate) fn take_started(&mut self) -> Option<StartSignal> {
        self.first_commit.take()
    }

    pub(crate) fn into_attempts(self) -> HashMap<String, u32> {
        self.tx_attempts
    }

    pub(crate) fn set_attempts(&mut self, attempts: HashMap<String, u32>) {
        self.tx_attempts = attempts;
    }

    /// External outcomes and failures not yet committed, to carry into a replay of the body.
    pub(crate) fn take_pending(&mut self) -> (Vec<StepRecord>, Option<WorkflowRecord>) {
        (std::mem::take(&mut self.pending_steps), self.insert.take())
    }

    pub(crate) fn restore_pending(&mut self, steps: Vec<StepRecord>) {
        for s in steps {
            self.push_step(s);
        }
    }
}

/// What a single-statement commit came to, seen from the context.
enum Single {
    /// Committed, with the phase steps' outputs.
    Done(Vec<Option<String>>),
    /// The phase's guard did not hold: nothing was written.
    GuardFailed,
    /// The store has no single-statement commits: nothing was done.
    Unsupported,
}

pub(crate) fn failure_json(f: &Failure) -> String {
    serde_json::to_string(f).unwrap_or_else(|_| format!("{{\"code\":\"{}\"}}", f.code))
}

pub(crate) fn parse_failure(error: Option<&str>) -> Failure {
    error
        .and_then(|e| serde_json::from_str(e).ok())
        .unwrap_or_else(|| Failure::new("failed", error.unwrap_or("failed").to_owned()))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
