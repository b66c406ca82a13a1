//! The engine's way out of a wait and out of a compensation (issue 30), on SQLite, Postgres and MySQL:
//! `Engine::wake` runs a workflow now — claims one released for a long persisted wait, cuts a run's in-process
//! wait short, leaves a lease another live engine holds alone, refuses an ended workflow — and a compensation
//! that cannot undo its step rolls the workflow forward (`Interrupt::RolledForward`): its own step commits with
//! the end, the compensations after it never run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use onceflow_engine::store::{CompensationStatus, WorkflowState};
use onceflow_engine::{
    BoxFuture, Compensation, Engine, EngineConfig, Error, Failure, Interrupt, Outcome, RetryPolicy, StepError, Woken,
    Workflow, WorkflowContext, step,
};
use onceflow_tests::{TestDb, effect_step, on_every_backend};
use serde_json::json;
use tokio::sync::Semaphore;

/// An external step whose first attempt fails retryably, to be tried again after `wait`; then `done`.
struct Waits {
    wait: Duration,
    calls: Arc<AtomicU32>,
    /// Held by the second attempt until the test lets it go (none: it goes at once).
    gate: Option<Arc<Semaphore>>,
}

impl<S: TestDb> Workflow<S> for Waits {
    const NAME: &'static str = "waits";
    type Input = ();
    type Output = u32;

    async fn run(&self, ctx: &mut WorkflowContext<S>, (): ()) -> Result<u32, Interrupt> {
        let policy =
            RetryPolicy { initial_interval: self.wait, max_interval: self.wait, jitter: false, ..Default::default() };
        let (calls, gate) = (&self.calls, &self.gate);
        ctx.external(step("ask").retry(policy), |attempt| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if attempt.number == 1 {
                return Err(StepError::Retryable("not yet".into()));
            }
            if let Some(gate) = gate {
                gate.acquire().await.expect("gate").forget();
            }
            Ok(attempt.number)
        })
        .await
    }
}

fn engine<S: TestDb>(store: S, wait: Duration, config: EngineConfig, gate: Option<Arc<Semaphore>>) -> Engine<S> {
    let calls = Arc::new(AtomicU32::new(0));
    Engine::builder(store).register(Waits { wait, calls, gate }).config(config).build()
}

/// Released for an hour (a persisted wait): woken, it is claimed here and its next attempt made now.
async fn a_woken_workflow_runs_now<S: TestDb>(store: S) {
    let e = engine(store.clone(), Duration::from_secs(3600), EngineConfig::default(), None);
    e.start::<Waits>("w", &()).await.unwrap();
    let asked = Instant::now();
    while store.workflow("w").await.unwrap().unwrap().lease_owner.is_some() {
        assert!(asked.elapsed() < Duration::from_secs(5), "not released for its wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(e.recover_once().await.unwrap(), 0, "not due for an hour");
    assert_eq!(e.wake("w").await.unwrap(), Woken::Claimed);
    let outcome = e.wait("w", Duration::from_secs(5)).await.unwrap();
    assert_eq!(outcome, Some(Outcome::Completed(json!(2))), "the second attempt, now");
    assert!(matches!(e.wake("w").await, Err(Error::InvalidState { .. })), "an ended workflow is not woken");
    assert!(matches!(e.wake("missing").await, Err(Error::NotFound(_))));
}

/// Waiting in-process (30 s, under `max_inline_wait`): woken, its run makes the next attempt at once.
async fn a_wake_cuts_a_runs_wait_short<S: TestDb>(store: S) {
    let config = EngineConfig { max_inline_wait: Duration::from_secs(60), ..EngineConfig::default() };
    let e = engine(store, Duration::from_secs(30), config, None);
    e.start::<Waits>("w", &()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(e.wait("w", Duration::ZERO).await.unwrap(), None, "still waiting");
    let woken = Instant::now();
    assert_eq!(e.wake("w").await.unwrap(), Woken::Running);
    let outcome = e.wait("w", Duration::from_secs(5)).await.unwrap();
    assert_eq!(outcome, Some(Outcome::Completed(json!(2))));
    assert!(woken.elapsed() < Duration::from_secs(5), "the 30 s wait was cut short");
}

/// Another live engine's run holds the workflow (in its call): a wake takes nothing from it — no claim, no
/// second call — and says so; the holder finishes it.
async fn a_wake_leaves_a_live_lease_alone<S: TestDb>(store: S) {
    let gate = Arc::new(Semaphore::new(0));
    let holder = engine(
        store.another_pool().await.unwrap(),
        Duration::from_millis(10),
        EngineConfig::default(),
        Some(gate.clone()),
    );
    holder.spawn_background();
    let other = engine(store.clone(), Duration::from_millis(10), EngineConfig::default(), None);
    holder.start::<Waits>("w", &()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let epoch = store.workflow("w").await.unwrap().unwrap().lease_epoch;
    assert_eq!(other.wake("w").await.unwrap(), Woken::HeldElsewhere);
    assert_eq!(store.workflow("w").await.unwrap().unwrap().lease_epoch, epoch, "not claimed");
    gate.add_permits(1);
    assert_eq!(holder.wait("w", Duration::from_secs(5)).await.unwrap(), Some(Outcome::Completed(json!(2))));
    holder.shutdown(Duration::from_millis(100)).await.unwrap();
}

/// `a` (with compensation `undo`), `b` (with compensation `keep`), then a terminal failure. `keep` cannot undo
/// `b`: it records `kept` and rolls the workflow forward; `undo` never runs.
struct KeepsB;

impl<S: TestDb> Workflow<S> for KeepsB {
    const NAME: &'static str = "keeps_b";
    type Input = ();
    type Output = String;

    async fn run(&self, ctx: &mut WorkflowContext<S>, (): ()) -> Result<String, Interrupt> {
        let id = ctx.workflow_id().to_owned();
        ctx.transactional(step("a").compensate_with("undo", "a"), effect_step::<S>(id.clone(), "a")).await?;
        ctx.external(step("b").compensate_with("keep", "b"), |_| async { Ok(()) }).await?;
        ctx.transactional("boom", |_c| -> BoxFuture<'_, Result<(), StepError>> {
            Box::pin(async { Err(StepError::terminal("boom", "failed after b")) })
        })
        .await?;
        Ok("never".into())
    }

    async fn compensate(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &Compensation,
        _failure: &Failure,
    ) -> Result<(), Interrupt> {
        let id = ctx.workflow_id().to_owned();
        if compensation.name == "undo" {
            return ctx.transactional("undo", effect_step::<S>(id, "undo:a")).await;
        }
        ctx.transactional("kept", effect_step::<S>(id, "kept:b")).await?;
        let exception = Failure::new("kept", "b cannot be undone").with_details(json!({"why": "the test says so"}));
        Err(Interrupt::RolledForward { output: json!("kept b"), exception })
    }
}

async fn a_compensation_rolls_the_workflow_forward<S: TestDb>(store: S) {
    let e = Engine::builder(store.clone()).register(KeepsB).build();
    e.start::<KeepsB>("k", &()).await.unwrap();
    let outcome = e.wait("k", Duration::from_secs(5)).await.unwrap();
    assert_eq!(outcome, Some(Outcome::Completed(json!("kept b"))));
    let view = e.workflow("k").await.unwrap().unwrap();
    assert_eq!(view.workflow.state, WorkflowState::Completed);
    assert_eq!(view.workflow.output.as_deref(), Some("\"kept b\""));
    let error: serde_json::Value = serde_json::from_str(view.workflow.error.as_deref().unwrap()).unwrap();
    assert_eq!(error["code"], "kept", "{error}");
    assert_eq!(error["details"]["failure"]["code"], "boom", "the failure it was compensating: {error}");
    assert_eq!(error["details"]["compensation"]["name"], "keep", "{error}");
    let statuses: Vec<_> = view.compensations.iter().map(|c| (c.name.as_str(), c.status)).collect();
    assert_eq!(statuses, [("undo", CompensationStatus::Registered), ("keep", CompensationStatus::Failed)]);
    assert_eq!(store.effects("k").await.unwrap(), ["a", "kept:b"], "its step committed, `undo` never ran");
    assert!(matches!(e.retry("k").await, Err(Error::InvalidState { .. })), "a completed workflow is not retried");
}

/// `a` (with compensation `undo`), then a body that rolls itself forward: completed with an exception.
struct RollsOnInBody;

impl<S: TestDb> Workflow<S> for RollsOnInBody {
    const NAME: &'static str = "rolls_on_in_body";
    type Input = ();
    type Output = String;

    async fn run(&self, ctx: &mut WorkflowContext<S>, (): ()) -> Result<String, Interrupt> {
        let id = ctx.workflow_id().to_owned();
        ctx.transactional(step("a").compensate_with("undo", "a"), effect_step::<S>(id, "a")).await?;
        Err(Interrupt::RolledForward { output: json!("on"), exception: Failure::new("rolled", "the body says so") })
    }
}

/// A workflow completed plainly keeps no compensations (none ran, none will: `engine.rs` checks it); one the
/// body completed with an exception keeps its list for the operator, as one a compensation rolled forward does.
async fn a_body_rolled_forward_keeps_its_compensations<S: TestDb>(store: S) {
    let e = Engine::builder(store.clone()).register(RollsOnInBody).build();
    e.start::<RollsOnInBody>("r", &()).await.unwrap();
    assert_eq!(e.wait("r", Duration::from_secs(5)).await.unwrap(), Some(Outcome::Completed(json!("on"))));
    let view = e.workflow("r").await.unwrap().unwrap();
    assert_eq!(view.workflow.state, WorkflowState::Completed);
    let statuses: Vec<_> = view.compensations.iter().map(|c| (c.name.as_str(), c.status)).collect();
    assert_eq!(statuses, [("undo", CompensationStatus::Registered)]);
}

on_every_backend!(
    a_woken_workflow_runs_now,
    a_wake_cuts_a_runs_wait_short,
    a_wake_leaves_a_live_lease_alone,
    a_compensation_rolls_the_workflow_forward,
    a_body_rolled_forward_keeps_its_compensations,
);
