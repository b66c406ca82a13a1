//! Driving one workflow instance: run or replay its body, then its compensations, and handle every way it can
//! stop (a wait, a lost lease, a shutdown, a database failure).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::context::WorkflowContext;
use crate::core::{Core, Ended, StartSignal};
use crate::error::{Error, Failure, Interrupt, TRANSIENT_RETRY_MS, failure_json, is_transient, parse_failure};
use crate::outcome::Outcome;
use crate::store::{CompensationStatus, StepStatus, Store, WorkflowRecord, WorkflowState, WorkflowUpdate};
use crate::workflow::{Compensation, ErasedWorkflow};

/// The key prefix of a compensation's steps: `compensate/<seq>/<step key>`.
pub(crate) const COMPENSATION_PREFIX: &str = "compensate/";

/// How many times a run replays a phase or commit undone by a transient error before releasing the workflow.
const MAX_TRANSIENT_REPLAYS: u32 = 5;

/// What a start refused or lost to a duplicate hears once its run is no longer driven here.
type Unrecorded = Option<(Option<StartSignal>, Result<bool, Error>)>;

/// Runs `record` (as run `run` of this process, see `Core::forget_running`) until it ends or stops, then tells
/// waiters. `insert` is true for a fresh start whose row the first commit inserts.
pub(crate) async fn drive<S: Store>(
    core: Arc<Core<S>>,
    wf: Arc<dyn ErasedWorkflow<S>>,
    record: WorkflowRecord,
    run: u64,
    insert: bool,
    started: Option<StartSignal>,
) {
    let (workflow_id, input_hash) = (record.workflow_id.clone(), record.input_hash.clone());
    // One span per run, a child of the context stored with the workflow: a run resumed by another process joins
    // the trace of the request that started it.
    let span = tracing::info_span!("workflow run", workflow_id = %record.workflow_id, name = %record.name,
        tenant = record.tenant.as_deref().unwrap_or(""));
    crate::trace::adopt(&span, record.trace.as_deref());
    let mut stopped = Stopped { core, workflow_id, run, returned: false, ended: None, unrecorded: None };
    let outcome = tracing::Instrument::instrument(
        drive_until_stopped(&stopped.core, wf.as_ref(), record, insert, started, &mut stopped.unrecorded),
        span,
    )
    .await;
    stopped.returned = true;
    stopped.ended = outcome.map(|outcome| Arc::new(Ended { outcome, input_hash }));
}

/// The end of a run, however it ends: returned, panicked, or its task dropped. On drop the workflow is no
/// longer driven here (so the heartbeat lets its lease expire, unless a newer run of this process drives it),
/// then the start and waiters hear of it.
struct Stopped<S: Store> {
    core: Arc<Core<S>>,
    workflow_id: String,
    run: u64,
    /// Whether the run returned (else it panicked, or its task was dropped).
    returned: bool,
    /// The run's outcome, with the input hash of the workflow it drove; `None` (also after a panic) sends
    /// waiters to the database.
    ended: Option<Arc<Ended>>,
    unrecorded: Unrecorded,
}

impl<S: Store> Drop for Stopped<S> {
    fn drop(&mut self) {
        if !self.returned {
            tracing::error!(workflow_id = %self.workflow_id,
                "workflow run panicked or was dropped; it is resumed once its lease expires");
        }
        self.core.forget_running(&self.workflow_id, self.run);
        // A start refused or lost to a duplicate hears of it only now: its caller may start the id again at
        // once, which must not find this run still here.
        if let Some((started, result)) = self.unrecorded.take() {
            signal(started, result);
        }
        // Without an outcome, waiters that attached in this process look at the database again (a refused
        // start left no workflow there; a panicked run left it to be resumed).
        self.core.announce(&self.workflow_id, self.ended.take());
    }
}

async fn drive_until_stopped<S: Store>(
    core: &Arc<Core<S>>,
    wf: &dyn ErasedWorkflow<S>,
    mut record: WorkflowRecord,
    insert: bool,
    started: Option<StartSignal>,
    unrecorded: &mut Unrecorded,
) -> Option<Outcome> {
    let id = record.workflow_id.clone();
    let mut ctx = WorkflowContext::new(core.clone(), &record, insert, started);
    let mut transient = 0u32;
    loop {
        if ctx.recorded() {
            match tokio::try_join!(core.store.steps(&id), core.store.compensations(&id)) {
                Ok((steps, comps)) => ctx.replay_from(steps, comps),
                Err(e) => {
                    back_off(core, &record, &e, false).await;
                    return None;
                }
            }
        } else {
            ctx.replay_from(Vec::new(), Vec::new());
        }
        let result = match run_once(&mut ctx, wf, &record).await {
            // A phase or commit that deadlocked or timed out on a lock did nothing: replay it, a few times,
            // before treating the database as failing.
            Err(Interrupt::Engine(Error::Database(e))) if is_transient(&e) && transient < MAX_TRANSIENT_REPLAYS => {
                transient += 1;
                tracing::debug!(workflow_id = %id, error = %e, "transient database error; replaying");
                ctx.abort_phase().await;
                Err(Interrupt::Retry { delay_ms: TRANSIENT_RETRY_MS * u64::from(transient) })
            }
            other => other,
        };
        match result {
            Ok(outcome) => return Some(outcome),
            Err(Interrupt::Retry { delay_ms }) => {
                let delay = Duration::from_millis(delay_ms);
                if delay > core.config.max_inline_wait || core.shutdown.is_cancelled() {
                    let until = core.now() + i64::try_from(delay_ms).unwrap_or(0);
                    release(&mut ctx, until).await;
                    return None;
                }
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = crate::core::woken(core.woken(&id)) => {}
                }
                if ctx.recorded() {
                    // The body may have moved the workflow on (to compensating) before the retry.
                    match core.store.workflow(&id).await {
                        Ok(Some(now)) if now.lease_epoch == record.lease_epoch => record = now,
                        _ => return None,
                    }
                }
            }
            Err(Interrupt::Suspended { .. } | Interrupt::LeaseLost) => return None,
            Err(Interrupt::Shutdown) => {
                // The open phase is not committed half-done (its steps run again after the restart); an
                // unrecorded workflow is not recorded at all (nothing of it left the database).
                ctx.abort_phase().await;
                if !ctx.recorded() {
                    *unrecorded = Some((ctx.take_started(), Err(Error::ShuttingDown)));
                    return None;
                }
                release(&mut ctx, core.now()).await;
                return None;
            }
            Err(Interrupt::Duplicate) => {
                *unrecorded = Some((ctx.take_started(), Ok(false)));
                return None;
            }
            Err(Interrupt::Refused(failure)) => {
                // What refused may be this start's own late view: another start of the id recorded it first (the
                // token this one would claim is that start's now). Then this start attaches to it.
                // (A failed read leaves the refusal as it is: the caller decides from its own records.)
                let refused = match core.store.workflow(&id).await {
                    Ok(Some(_)) => Ok(false),
                    Ok(None) | Err(_) => Err(Error::Refused(failure)),
                };
                *unrecorded = Some((ctx.take_started(), refused));
                return None;
            }
            Err(other) => {
                ctx.abort_phase().await;
                let e = interrupted(other);
                back_off(core, &record, &e, !ctx.recorded()).await;
                *unrecorded = Some((ctx.take_started(), Err(e)));
                return None;
            }
        }
    }
}

/// Commits what the run has done so far and releases the workflow until `until`. A start still waiting for
/// the first commit hears of it either way.
async fn release<S: Store>(ctx: &mut WorkflowContext<S>, until: i64) {
    let update = WorkflowUpdate { release_until: Some(until), ..Default::default() };
    if let Err(e) = ctx.commit(update).await {
        signal(ctx.take_started(), Err(interrupted(e)));
    }
}

/// The error a start sees when its workflow's run stopped before the first commit.
fn interrupted(i: Interrupt) -> Error {
    match i {
        Interrupt::Engine(e) => e,
        Interrupt::Shutdown => Error::ShuttingDown,
        other => Error::Interrupted(other.to_string()),
    }
}

fn signal(started: Option<StartSignal>, result: Result<bool, Error>) {
    if let Some(s) = started {
        let _ = s.send(result);
    }
}

/// After a database failure: logs it and, if the workflow is recorded, releases it to be retried in a second
/// (by any process); if releasing fails too, the lease simply expires (the run is no longer driven here, so
/// no heartbeat extends it).
async fn back_off<S: Store>(core: &Core<S>, record: &WorkflowRecord, e: &Error, unrecorded: bool) {
    tracing::warn!(workflow_id = %record.workflow_id, error = %e, "workflow run stopped; it will be retried");
    if !unrecorded {
        let now = core.now();
        if let Err(e) = core.store.release(&record.workflow_id, record.lease_epoch, now + 1000, now).await {
            tracing::warn!(workflow_id = %record.workflow_id, error = %e,
                "could not release the workflow; it is resumed once its lease expires");
        }
    }
}

/// Runs the body (unless it already failed), then the compensations of a failure.
async fn run_once<S: Store>(
    ctx: &mut WorkflowContext<S>,
    wf: &dyn ErasedWorkflow<S>,
    record: &WorkflowRecord,
) -> Result<Outcome, Interrupt> {
    let failure = if record.state == WorkflowState::Running {
        let ran = match wf.run(ctx, &record.input).await {
            Ok(output) => {
                let value: Value = serde_json::from_str(&output).unwrap_or(Value::Null);
                // `Failed` here: the body's last phase, deferred to this commit, did not hold its guard.
                ctx.commit(finish(WorkflowState::Completed, Some(output), None, ctx.now_ms())).await.map(|()| value)
            }
            Err(e) => Err(e),
        };
        match ran {
            Ok(value) => return Ok(Outcome::Completed(value)),
            Err(Interrupt::Refused(failure)) => {
                // The refusing phase is undone, not committed. Before the first commit nothing of the workflow
                // exists, so the start is refused; after it, the refusal fails the workflow like a failed step.
                ctx.abort_phase().await;
                if !ctx.recorded() {
                    return Err(Interrupt::Refused(failure));
                }
                ctx.commit(compensating(&failure)).await?;
                failure
            }
            Err(Interrupt::Failed(failure)) => {
                ctx.commit(compensating(&failure)).await?;
                failure
            }
            Err(e @ Interrupt::StepMismatch { .. }) => {
                ctx.abort_phase().await;
                let failure = Failure::new("step_mismatch", e.to_string());
                ctx.commit(finish(WorkflowState::Failed, None, Some(&failure), ctx.now_ms())).await?;
                return Ok(Outcome::Failed(failure));
            }
            Err(Interrupt::RolledForward { output, exception }) => {
                return rolled_forward(ctx, output, exception).await;
            }
            Err(other) => return Err(other),
        }
    } else {
        parse_failure(record.error.as_deref())
    };
    compensate(ctx, wf, failure).await
}

/// Runs the registered compensations in reverse order, each as durable steps; ends the workflow.
async fn compensate<S: Store>(
    ctx: &mut WorkflowContext<S>,
    wf: &dyn ErasedWorkflow<S>,
    failure: Failure,
) -> Result<Outcome, Interrupt> {
    let comps = ctx.core().store.compensations(ctx.workflow_id()).await?;
    for c in comps.iter().rev().filter(|c| c.status != CompensationStatus::Done) {
        // A forward step that left no row never happened (a phase step whose condition did not hold): there is
        // nothing of it to undo.
        let Some(forward) = ctx.step(&c.step_key) else {
            ctx.push_compensation_status(c.clone(), CompensationStatus::Done);
            continue;
        };
        let forward = match forward.status {
            StepStatus::Completed => forward.output.as_deref().and_then(|o| serde_json::from_str(o).ok()),
            _ => None,
        };
        ctx.set_prefix(format!("{COMPENSATION_PREFIX}{}/", c.seq));
        let compensation = Compensation {
            step_key: c.step_key.clone(),
            name: c.name.clone(),
            input: serde_json::from_str(&c.input).unwrap_or(Value::Null),
            forward,
        };
        match wf.compensate(ctx, &compensation, &failure).await {
            Ok(()) => ctx.push_compensation_status(c.clone(), CompensationStatus::Done),
            Err(Interrupt::RolledForward { output, mut exception }) => {
                // Not undone: the compensation says so (`failed`), and the ones after it never run.
                ctx.push_compensation_status(c.clone(), CompensationStatus::Failed);
                ctx.set_prefix(String::new());
                exception.details = json!({
                    "details": exception.details,
                    "failure": failure,
                    "compensation": { "name": c.name, "step_key": c.step_key },
                });
                tracing::warn!(workflow_id = %ctx.workflow_id(), compensation = %c.name, code = %exception.code,
                    "a compensation could not undo its step: the workflow rolled forward");
                return rolled_forward(ctx, output, exception).await;
            }
            Err(e @ (Interrupt::Failed(_) | Interrupt::Refused(_) | Interrupt::StepMismatch { .. })) => {
                ctx.abort_phase().await;
                ctx.push_compensation_status(c.clone(), CompensationStatus::Failed);
                let reason = match e {
                    Interrupt::Failed(f) | Interrupt::Refused(f) => f,
                    other => Failure::new("step_mismatch", other.to_string()),
                };
                let mut failed = failure.clone();
                failed.details = json!({
                    "details": failure.details,
                    "compensation": { "name": c.name, "step_key": c.step_key, "failure": reason },
                });
                ctx.set_prefix(String::new());
                ctx.commit(finish(WorkflowState::CompensationFailed, None, Some(&failed), ctx.now_ms())).await?;
                return Ok(Outcome::CompensationFailed(failed));
            }
            Err(other) => return Err(other),
        }
    }
    ctx.set_prefix(String::new());
    let cancelled = failure.code == crate::error::CANCELLED_CODE;
    let final_state = if cancelled { WorkflowState::Cancelled } else { WorkflowState::Failed };
    ctx.commit(finish(final_state, None, Some(&failure), ctx.now_ms())).await?;
    Ok(if cancelled { Outcome::Cancelled(failure) } else { Outcome::Failed(failure) })
}

/// Ends the workflow `completed` with `output`, keeping `exception` as its error (see
/// [`Interrupt::RolledForward`]): the open phase commits with it.
async fn rolled_forward<S: Store>(
    ctx: &mut WorkflowContext<S>,
    output: Value,
    exception: Failure,
) -> Result<Outcome, Interrupt> {
    let text = serde_json::to_string(&output).map_err(|e| Interrupt::Engine(e.into()))?;
    ctx.commit(finish(WorkflowState::Completed, Some(text), Some(&exception), ctx.now_ms())).await?;
    Ok(Outcome::Completed(output))
}

/// The commit that moves a failed workflow on to its compensations.
fn compensating(failure: &Failure) -> WorkflowUpdate {
    WorkflowUpdate {
        state: Some(WorkflowState::Compensating),
        error: Some(failure_json(failure)),
        ..Default::default()
    }
}

fn finish(state: WorkflowState, output: Option<String>, failure: Option<&Failure>, now: i64) -> WorkflowUpdate {
    WorkflowUpdate { state: Some(state), output, error: failure.map(failure_json), release_until: Some(now) }
}
