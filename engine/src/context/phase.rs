//! Statement phases: transactional steps given as SQL and sent with their commit as one call, their replay, and
//! the phase deferred to the workflow's completing commit.

use serde_json::Value;

use crate::error::{Error, Interrupt, failure_json};
use crate::phase::{PhaseCommit, PhaseRow, PhaseStep, StatementPhase};
use crate::store::{Committed, StepKind, StepRecord, StepStatus, Store, WorkflowUpdate};

use super::WorkflowContext;

impl<S: Store> WorkflowContext<S> {
    /// Runs a statement phase: its transactional steps (see [`StatementPhase`]) and the commit they end with, as
    /// one call where the store can (Postgres: one statement, one round trip; SQLite: one call to the writer).
    /// Returns each step's output, `None` for a step whose condition did not hold and for an external step's
    /// intent. A phase that already committed returns its stored outputs; an open phase of closure steps commits
    /// first. Only on the stores with one-call commits, Postgres and SQLite: on MySQL it fails the run (build
    /// phases only where the store has them).
    pub async fn statement_phase(&mut self, phase: StatementPhase) -> Result<Vec<Option<Value>>, Interrupt> {
        if let Some(outputs) = self.replay_phase(&phase)? {
            return Ok(outputs);
        }
        self.check_shutdown()?;
        if self.replay.tx.is_some() {
            self.commit(WorkflowUpdate::default()).await?;
        }
        self.run_phase(&phase, &WorkflowUpdate::default()).await
    }

    /// Defers the statement phase `phase` to the commit that completes the workflow, and returns `output`, which
    /// the body must return at once: the phase's steps, the workflow's end and its output are then written by
    /// one call. If the phase's guard does not hold there, the workflow fails with the guard's failure
    /// (and compensates) instead of completing.
    pub async fn finish_with<T>(&mut self, phase: StatementPhase, output: T) -> Result<T, Interrupt> {
        if self.replay_phase(&phase)?.is_some() {
            return Ok(output);
        }
        self.check_shutdown()?;
        if self.replay.tx.is_some() {
            self.commit(WorkflowUpdate::default()).await?;
        }
        self.replay.deferred = Some(phase);
        Ok(output)
    }

    /// A phase's stored outputs, if it committed before.
    pub(super) fn replay_phase(&self, phase: &StatementPhase) -> Result<Option<Vec<Option<Value>>>, Interrupt> {
        let keys = phase.keys(&self.replay.prefix);
        let steps = keys.iter().zip(&phase.steps).filter(|(_, s)| !s.intent);
        if !steps.clone().any(|(k, _)| self.replay.history.contains_key(k)) {
            return Ok(None);
        }
        let mut outputs = Vec::new();
        for (key, step) in keys.iter().zip(&phase.steps) {
            if step.intent {
                outputs.push(None);
                continue;
            }
            outputs.push(match self.replay::<Value>(key, &step.spec.name, StepKind::Transactional)? {
                Some(done) => Some(done?),
                None if self.replay.history.contains_key(key) => {
                    return Err(Interrupt::Engine(Error::Interrupted(format!("step {key} is unfinished"))));
                }
                None => None,
            });
        }
        Ok(Some(outputs))
    }

    /// Commits `phase` with the pending rows and `update` as one call; records its steps.
    pub(super) async fn run_phase(
        &mut self,
        phase: &StatementPhase,
        update: &WorkflowUpdate,
    ) -> Result<Vec<Option<Value>>, Interrupt> {
        for step in &phase.steps {
            if let Some((name, input)) = &step.spec.compensation {
                let key = format!("{}{}", self.replay.prefix, step.spec.key);
                self.register_compensation(&key, name, input)?;
            }
        }
        let now = self.core.now();
        let keys = phase.keys(&self.replay.prefix);
        let seqs: Vec<i32> = keys.iter().map(|key| self.seq_of(key)).collect();
        let rows: Vec<PhaseRow<'_>> = keys
            .iter()
            .zip(&phase.steps)
            .zip(&seqs)
            .map(|((key, step), &seq)| PhaseRow {
                key: key.clone(),
                name: &step.spec.name,
                kind: if step.intent { StepKind::External } else { StepKind::Transactional },
                status: if step.intent { StepStatus::Started } else { StepStatus::Completed },
                attempts: i32::try_from(self.run.tx_attempts.get(key).copied().unwrap_or(0) + 1).unwrap_or(i32::MAX),
                output: &step.output,
                finished: !step.intent,
                when: step.when.as_deref(),
                seq,
            })
            .collect();
        let span = tracing::info_span!("step", workflow_id = %self.run.workflow_id, step_key = %keys.join(","), kind = "statement phase");
        let result = tracing::Instrument::instrument(
            self.commit_in_one_call(update, Some(PhaseCommit { phase, rows: &rows, now })),
            span,
        )
        .await;
        drop(rows);
        let outputs = match result {
            Ok(Some(Committed::Done { outputs, .. })) => outputs,
            Ok(Some(Committed::GuardFailed)) if self.run.insert.is_some() => {
                // The workflow's first commit: nothing of it exists, so it was never started.
                self.abort_phase().await;
                return Err(Interrupt::Refused(phase.guard_failure()));
            }
            Ok(Some(Committed::GuardFailed)) => {
                self.abort_phase().await;
                let failure = phase.guard_failure();
                if let (Some(key), Some(first)) = (keys.first(), phase.steps.first()) {
                    let error = Some(failure_json(&failure));
                    let failed = StepRecord { status: StepStatus::Failed, error, ..self.phase_record(key, first, now) };
                    self.push_step(failed);
                }
                return Err(Interrupt::Failed(failure));
            }
            Ok(Some(Committed::LeaseLost)) => {
                self.abort_phase().await;
                return Err(Interrupt::LeaseLost);
            }
            Ok(Some(Committed::Duplicate)) => {
                self.abort_phase().await;
                return Err(Interrupt::Duplicate);
            }
            Ok(None) => {
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
        for (((key, step), output), seq) in keys.into_iter().zip(&phase.steps).zip(outputs).zip(seqs) {
            if step.intent {
                values.push(None);
                // Written only if its condition held: the body's next call of the external step starts from it.
                if output.is_some() {
                    let intent = StepRecord {
                        kind: StepKind::External,
                        status: StepStatus::Started,
                        finished_at: None,
                        seq: Some(seq),
                        ..self.phase_record(&key, step, now)
                    };
                    self.replay.history.insert(key.clone(), intent);
                    self.replay.fresh_intents.insert(key);
                }
                continue;
            }
            let Some(output) = output else {
                values.push(None);
                continue;
            };
            values.push(Some(serde_json::from_str(&output).map_err(|e| Interrupt::Engine(e.into()))?));
            let completed = StepRecord { output: Some(output), seq: Some(seq), ..self.phase_record(&key, step, now) };
            self.replay.history.insert(key, completed);
        }
        Ok(values)
    }

    /// A phase step's row as the statement wrote it (transactional, completed, no output yet).
    pub(super) fn phase_record(&self, key: &str, step: &PhaseStep, now: i64) -> StepRecord {
        StepRecord {
            workflow_id: self.run.workflow_id.clone(),
            step_key: key.to_owned(),
            step_name: step.spec.name.clone(),
            kind: StepKind::Transactional,
            status: StepStatus::Completed,
            attempts: 1,
            output: None,
            error: None,
            started_at: now,
            finished_at: Some(now),
            seq: self.replay.history.get(key).and_then(|s| s.seq),
        }
    }
}
