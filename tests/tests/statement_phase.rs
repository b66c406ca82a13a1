//! Statement phases on Postgres (a phase of steps sent with its commit as one statement): the steps' writes, their
//! rows and the workflow's progress commit together or not at all — under a lost lease, a racing duplicate
//! start, a guard that does not hold (on the first commit: the start is refused), and a phase deferred to the
//! workflow's completing commit.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::{
    Engine, EngineConfig, Failure, Interrupt, ManualClock, Outcome, PgStore, PhaseStep, SqlArg, StatementPhase, Store,
    Workflow, WorkflowContext, state, step, step_status,
};
use onceflow_tests::{TestDb, pg_store};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

const WAIT: Duration = Duration::from_secs(20);
const LEASE_MS: i64 = 10_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plan {
    /// The phase's guard holds.
    guard: bool,
    /// The phase is deferred to the completing commit.
    deferred: bool,
    /// Pause at the external step before the phase (the test releases it).
    pause: bool,
    /// Skip the external step: the phase is the first commit.
    phase_first: bool,
}

/// `e1` (external, pausable), then a statement phase writing effect `p` under step `write` (output
/// `"written"`), registering compensation `undo`.
struct Phased {
    paused: Arc<Notify>,
    resume: Arc<Notify>,
}

fn phase(ctx: &WorkflowContext<PgStore>, guard: bool) -> StatementPhase {
    let ctes = vec!["e AS (INSERT INTO effects (workflow_id, what) VALUES ($1, 'p') RETURNING 1)".to_owned()];
    let args = vec![SqlArg::Text(ctx.workflow_id().to_owned())];
    let steps = vec![PhaseStep::new(step("write").compensate_with("undo", ()), "'\"written\"'")];
    let condition = if guard { "EXISTS (SELECT 1 FROM e)" } else { "NOT EXISTS (SELECT 1 FROM e)" };
    StatementPhase::new(ctes, args, steps).guard(condition, Failure::new("guarded", "the guard did not hold"))
}

impl Workflow<PgStore> for Phased {
    const NAME: &'static str = "phased";
    type Input = Plan;
    type Output = String;

    async fn run(&self, ctx: &mut WorkflowContext<PgStore>, plan: Plan) -> Result<String, Interrupt> {
        let (paused, resume) = (self.paused.clone(), self.resume.clone());
        if plan.phase_first {
            let outputs = ctx.statement_phase(phase(ctx, plan.guard)).await?;
            return Ok(outputs[0].as_ref().and_then(|v| v.as_str()).unwrap_or_default().to_owned());
        }
        ctx.external(step("e1").compensate_with("undo_e1", ()), |_| {
            let (paused, resume) = (paused.clone(), resume.clone());
            async move {
                if plan.pause {
                    paused.notify_one();
                    resume.notified().await;
                }
                Ok(())
            }
        })
        .await?;
        let phase = phase(ctx, plan.guard);
        if plan.deferred {
            return ctx.finish_with(phase, "done".to_owned()).await;
        }
        let outputs = ctx.statement_phase(phase).await?;
        Ok(outputs[0].as_ref().and_then(|v| v.as_str()).unwrap_or_default().to_owned())
    }

    async fn compensate(
        &self,
        ctx: &mut WorkflowContext<PgStore>,
        compensation: &onceflow_engine::Compensation,
        _failure: &Failure,
    ) -> Result<(), Interrupt> {
        let (id, what) = (ctx.workflow_id().to_owned(), format!("undo:{}", compensation.name));
        ctx.transactional(compensation.name.as_str(), move |c| PgStore::effect(c, id, what)).await
    }
}

fn engine(store: PgStore, clock: &ManualClock) -> (Engine<PgStore>, Arc<Notify>, Arc<Notify>) {
    let (paused, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = Engine::builder(store)
        .register(Phased { paused: paused.clone(), resume: resume.clone() })
        .clock(clock.clone())
        .config(EngineConfig { lease: Duration::from_millis(LEASE_MS as u64), ..EngineConfig::default() })
        .build();
    (engine, paused, resume)
}

fn clock() -> ManualClock {
    ManualClock::new(1_800_000_000_000)
}

fn plan(guard: bool, deferred: bool) -> Plan {
    Plan { guard, deferred, pause: false, phase_first: false }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phase_commits_its_step_and_writes_once() {
    let Some(store) = pg_store().await.unwrap() else { return };
    let (engine, _, _) = engine(store.clone(), &clock());
    let outcome = engine.start::<Phased>("ok", &plan(true, false)).await.unwrap().wait(WAIT).await.unwrap();
    assert_eq!(outcome, Some(Outcome::Completed(serde_json::json!("written"))));
    assert_eq!(store.effects("ok").await.unwrap(), ["p"]);
    let steps = store.steps("ok").await.unwrap();
    let write = steps.iter().find(|s| s.step_key == "write").expect("write's row");
    assert_eq!((write.status.as_str(), write.output.as_deref()), (step_status::COMPLETED, Some("\"written\"")));
    let comps = store.compensations("ok").await.unwrap();
    assert_eq!(comps.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["undo_e1", "undo"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_guard_writes_nothing_and_fails_the_step() {
    let Some(store) = pg_store().await.unwrap() else { return };
    let (engine, _, _) = engine(store.clone(), &clock());
    for (id, deferred) in [("guard", false), ("guard-deferred", true)] {
        let outcome = engine.start::<Phased>(id, &plan(false, deferred)).await.unwrap().wait(WAIT).await.unwrap();
        let Some(Outcome::Failed(failure)) = outcome else { panic!("{id}: expected a failure, got {outcome:?}") };
        assert_eq!(failure.code, "guarded");
        // The phase's insert rolled back with the statement; its compensation was never registered, so only
        // e1's ran.
        assert_eq!(store.effects(id).await.unwrap(), ["undo:undo_e1"], "{id}");
        let steps = store.steps(id).await.unwrap();
        let write = steps.iter().find(|s| s.step_key == "write").expect("write's row");
        assert_eq!(write.status, step_status::FAILED, "{id}");
        assert_eq!(store.workflow(id).await.unwrap().unwrap().state, state::FAILED);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_phase_whose_guard_fails_refuses_the_start() {
    let Some(store) = pg_store().await.unwrap() else { return };
    let (engine, _, _) = engine(store.clone(), &clock());
    let refused = Plan { phase_first: true, ..plan(false, false) };
    match engine.start::<Phased>("refused", &refused).await {
        Err(onceflow_engine::Error::Refused(failure)) => assert_eq!(failure.code, "guarded"),
        other => panic!("expected a refused start, got {:?}", other.map(|h| h.attached())),
    }
    // Nothing of it exists: no workflow, no step, no effect; the id can start again.
    assert!(store.workflow("refused").await.unwrap().is_none());
    assert!(store.steps("refused").await.unwrap().is_empty());
    assert!(store.effects("refused").await.unwrap().is_empty());
    let accepted = Plan { phase_first: true, ..plan(true, false) };
    let outcome = engine.start::<Phased>("refused", &accepted).await.unwrap().wait(WAIT).await.unwrap();
    assert!(matches!(outcome, Some(Outcome::Completed(_))));
    assert_eq!(store.effects("refused").await.unwrap(), ["p"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_worker_writes_nothing_with_its_phase() {
    let Some(store) = pg_store().await.unwrap() else { return };
    let clock = clock();
    for (id, deferred) in [("fenced", false), ("fenced-deferred", true)] {
        let (old, paused, resume) = engine(store.another_pool().await.unwrap(), &clock);
        let starter = {
            let old = old.clone();
            let plan = Plan { guard: true, deferred, pause: true, phase_first: false };
            tokio::spawn(async move { old.start::<Phased>(id, &plan).await.map(|_| ()) })
        };
        paused.notified().await;
        starter.await.unwrap().unwrap();
        clock.advance(LEASE_MS + 1);
        let (new, _, new_resume) = engine(store.another_pool().await.unwrap(), &clock);
        new_resume.notify_one(); // the new worker's call does not pause
        assert_eq!(new.recover_once().await.unwrap(), 1);
        assert!(matches!(new.wait(id, WAIT).await.unwrap(), Some(Outcome::Completed(_))), "{id}");
        // The old worker's call returns: its phase's statement meets the new epoch and must write nothing.
        resume.notify_one();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(store.effects(id).await.unwrap(), ["p"], "{id}");
        assert_eq!(store.workflow(id).await.unwrap().unwrap().state, state::COMPLETED);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_starts_in_two_processes_write_once() {
    let Some(store) = pg_store().await.unwrap() else { return };
    let clock = clock();
    for round in 0..10 {
        let id = format!("race-{round}");
        let (a, _, _) = engine(store.another_pool().await.unwrap(), &clock);
        let (b, _, _) = engine(store.another_pool().await.unwrap(), &clock);
        let first = Plan { phase_first: true, ..plan(true, false) };
        let (ra, rb) = tokio::join!(a.start::<Phased>(&id, &first), b.start::<Phased>(&id, &first));
        for handle in [ra.unwrap(), rb.unwrap()] {
            assert!(matches!(handle.wait(WAIT).await.unwrap(), Some(Outcome::Completed(_))), "{id}");
        }
        assert_eq!(store.effects(&id).await.unwrap(), ["p"], "{id}");
    }
}
