//! Statement phases on Postgres (a phase of steps sent with its commit as one statement) and on SQLite (one
//! multi-statement call, `BEGIN IMMEDIATE` to `COMMIT`): the steps' writes, their rows and the workflow's
//! progress commit together or not at all — under a lost lease, a racing duplicate start, a guard that does
//! not hold (on the first commit: the start is refused), a phase deferred to the workflow's completing commit,
//! and SQL that fails.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::clock::ManualClock;
use onceflow_engine::phase::{PhaseStep, SqlArg, StatementPhase};
use onceflow_engine::store::{SQLITE_PHASE_FLAGS, StepStatus, WorkflowState};
use onceflow_engine::{
    Engine, EngineConfig, Failure, Interrupt, Outcome, PgStore, SqliteStore, Workflow, WorkflowContext, step,
};
use onceflow_tests::TestDb;
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
    /// The phase's SQL fails (a `NOT NULL` column left empty).
    broken: bool,
}

/// `e1` (external, pausable), then a statement phase writing effect `p` under step `write` (output
/// `"written"`), registering compensation `undo`.
struct Phased {
    paused: Arc<Notify>,
    resume: Arc<Notify>,
}

/// A store with statement phases, and the phase inserting effect `p` in its dialect.
trait PhaseDb: TestDb {
    /// The phase's SQL: the insert of `what` (`$1` the workflow id), and the test whether it wrote.
    fn insert_effect(what: &str) -> (Vec<String>, String);
}

impl PhaseDb for PgStore {
    fn insert_effect(what: &str) -> (Vec<String>, String) {
        let cte = format!("e AS (INSERT INTO effects (workflow_id, what) VALUES ($1, {what}) RETURNING 1)");
        (vec![cte], "EXISTS (SELECT 1 FROM e)".to_owned())
    }
}

impl PhaseDb for SqliteStore {
    fn insert_effect(what: &str) -> (Vec<String>, String) {
        let statements = vec![
            format!("INSERT INTO effects (workflow_id, what) VALUES ($1, {what})"),
            format!("INSERT INTO {SQLITE_PHASE_FLAGS} SELECT 'e' WHERE changes() > 0"),
        ];
        (statements, format!("EXISTS (SELECT 1 FROM {SQLITE_PHASE_FLAGS} WHERE flag = 'e')"))
    }
}

fn phase<S: PhaseDb>(ctx: &WorkflowContext<S>, plan: &Plan) -> StatementPhase {
    let (parts, wrote) = S::insert_effect(if plan.broken { "NULL" } else { "'p'" });
    let args = vec![SqlArg::Text(ctx.workflow_id().to_owned())];
    let steps = vec![PhaseStep::new(step("write").compensate_with("undo", ()), "'\"written\"'")];
    let condition = if plan.guard { wrote } else { format!("NOT {wrote}") };
    StatementPhase::new(parts, args, steps).guard(condition, Failure::new("guarded", "the guard did not hold"))
}

impl<S: PhaseDb> Workflow<S> for Phased {
    const NAME: &'static str = "phased";
    type Input = Plan;
    type Output = String;

    async fn run(&self, ctx: &mut WorkflowContext<S>, plan: Plan) -> Result<String, Interrupt> {
        let (paused, resume) = (self.paused.clone(), self.resume.clone());
        if plan.phase_first {
            let outputs = ctx.statement_phase(phase(ctx, &plan)).await?;
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
        let phase = phase(ctx, &plan);
        if plan.deferred {
            return ctx.finish_with(phase, "done".to_owned()).await;
        }
        let outputs = ctx.statement_phase(phase).await?;
        Ok(outputs[0].as_ref().and_then(|v| v.as_str()).unwrap_or_default().to_owned())
    }

    async fn compensate(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &onceflow_engine::Compensation,
        _failure: &Failure,
    ) -> Result<(), Interrupt> {
        let (id, what) = (ctx.workflow_id().to_owned(), format!("undo:{}", compensation.name));
        ctx.transactional(compensation.name.as_str(), move |c| S::effect(c, id, what)).await
    }
}

fn engine<S: PhaseDb>(store: S, clock: &ManualClock) -> (Engine<S>, Arc<Notify>, Arc<Notify>) {
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
    Plan { guard, deferred, pause: false, phase_first: false, broken: false }
}

onceflow_tests::on_sqlite_and_postgres!(
    a_phase_commits_its_step_and_writes_once,
    a_failed_guard_writes_nothing_and_fails_the_step,
    a_first_phase_whose_guard_fails_refuses_the_start,
    a_fenced_worker_writes_nothing_with_its_phase,
    racing_starts_in_two_processes_write_once,
    a_phase_whose_sql_fails_leaves_the_writer_usable,
    concurrent_phases_commit_or_undo_each_alone,
);

async fn a_phase_commits_its_step_and_writes_once<S: PhaseDb>(store: S) {
    let (engine, _, _) = engine(store.clone(), &clock());
    let outcome = engine.start::<Phased>("ok", &plan(true, false)).await.unwrap().wait(WAIT).await.unwrap();
    assert_eq!(outcome, Some(Outcome::Completed(serde_json::json!("written"))));
    assert_eq!(store.effects("ok").await.unwrap(), ["p"]);
    let steps = store.steps("ok").await.unwrap();
    let write = steps.iter().find(|s| s.step_key == "write").expect("write's row");
    assert_eq!((write.status, write.output.as_deref()), (StepStatus::Completed, Some("\"written\"")));
    // Completed with none of them run: the list is not kept.
    assert_eq!(store.compensations("ok").await.unwrap(), []);
}

async fn a_failed_guard_writes_nothing_and_fails_the_step<S: PhaseDb>(store: S) {
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
        assert_eq!(write.status, StepStatus::Failed, "{id}");
        assert_eq!(store.workflow(id).await.unwrap().unwrap().state, WorkflowState::Failed);
    }
}

async fn a_first_phase_whose_guard_fails_refuses_the_start<S: PhaseDb>(store: S) {
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

async fn a_fenced_worker_writes_nothing_with_its_phase<S: PhaseDb>(store: S) {
    let clock = clock();
    for (id, deferred) in [("fenced", false), ("fenced-deferred", true)] {
        let (old, paused, resume) = engine(store.another_pool().await.unwrap(), &clock);
        let starter = {
            let old = old.clone();
            let plan = Plan { pause: true, ..plan(true, deferred) };
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
        assert_eq!(store.workflow(id).await.unwrap().unwrap().state, WorkflowState::Completed);
    }
}

async fn racing_starts_in_two_processes_write_once<S: PhaseDb>(store: S) {
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

/// SQL that fails inside the phase (not a check) leaves no transaction open: on SQLite the one call began one on
/// the single writer connection, and every later commit would fail if it were not rolled back.
async fn a_phase_whose_sql_fails_leaves_the_writer_usable<S: PhaseDb>(store: S) {
    let (engine, _, _) = engine(store.clone(), &clock());
    let broken = Plan { phase_first: true, broken: true, ..plan(true, false) };
    let first = tokio::time::timeout(WAIT, engine.start::<Phased>("broken", &broken)).await.expect("start answers");
    assert!(first.is_err(), "a phase writing NULL into a NOT NULL column cannot commit");
    assert!(store.effects("broken").await.unwrap().is_empty());
    for id in ["after-1", "after-2"] {
        let outcome = engine.start::<Phased>(id, &plan(true, false)).await.unwrap().wait(WAIT).await.unwrap();
        assert_eq!(outcome, Some(Outcome::Completed(serde_json::json!("written"))), "{id}");
        assert_eq!(store.effects(id).await.unwrap(), ["p"], "{id}");
    }
}

/// Many phases at once, some refused by their guard and some failing in their SQL among those that commit: on
/// SQLite they share group commits, where each that fails must be undone alone (its savepoint) and each that
/// commits must be written once.
async fn concurrent_phases_commit_or_undo_each_alone<S: PhaseDb>(store: S) {
    let (engine, _, _) = engine(store.clone(), &clock());
    let kinds = ["ok", "refused", "broken"];
    let starts = (0..45).map(|n| {
        let (engine, kind) = (engine.clone(), kinds[n % 3]);
        let plan = Plan { phase_first: true, guard: kind != "refused", broken: kind == "broken", ..plan(true, false) };
        tokio::spawn(async move {
            let id = format!("{kind}-{n}");
            let started = engine.start::<Phased>(&id, &plan).await;
            let outcome = match started {
                Ok(handle) => handle.wait(WAIT).await.ok().flatten(),
                Err(_) => None,
            };
            (id, kind, outcome)
        })
    });
    for joined in futures_join(starts).await {
        let (id, kind, outcome) = joined;
        let effects = store.effects(&id).await.unwrap();
        match kind {
            "ok" => {
                assert_eq!(outcome, Some(Outcome::Completed(serde_json::json!("written"))), "{id}");
                assert_eq!(effects, ["p"], "{id}");
            }
            _ => {
                assert!(outcome.is_none(), "{id}: {outcome:?}");
                assert!(effects.is_empty(), "{id}: {effects:?}");
                assert!(store.workflow(&id).await.unwrap().is_none(), "{id}");
            }
        }
    }
}

async fn futures_join<T: Send + 'static>(tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for t in tasks.collect::<Vec<_>>() {
        out.push(t.await.unwrap());
    }
    out
}
