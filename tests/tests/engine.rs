//! The engine's guarantees, each on SQLite, Postgres and MySQL: exactly-once transactional steps across dropped
//! workers and races, fencing, compensation, concurrent starts, persisted waits and operator actions.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use onceflow_engine::clock::ManualClock;
use onceflow_engine::store::{CompensationStatus, StepStatus, WorkflowState};
use onceflow_engine::{
    Engine, EngineConfig, Error, Interrupt, Outcome, Previous, RetryPolicy, StepError, Store, Workflow,
    WorkflowContext, step,
};
use onceflow_tests::{Hooks, Steps, StepsInput, TestDb, effect_step, on_every_backend};

const LEASE_MS: i64 = 10_000;
const WAIT: Duration = Duration::from_secs(20);

fn input(label: &str, fail: bool) -> StepsInput {
    StepsInput { label: label.to_owned(), fail }
}

fn engine<S: TestDb>(store: S, clock: &ManualClock, hooks: &Arc<Hooks>) -> Engine<S> {
    Engine::builder(store)
        .register(Steps { hooks: hooks.clone() })
        .register(Flaky)
        .register(Refusing)
        .clock(clock.clone())
        .config(EngineConfig { lease: Duration::from_millis(LEASE_MS as u64), ..EngineConfig::default() })
        .build()
}

fn clock() -> ManualClock {
    ManualClock::new(1_800_000_000_000)
}

/// Starts `Steps` in an engine of its own runtime and pool, and drops the whole runtime (tasks, transactions,
/// connections) once the workflow reaches `point`: a worker that dies there.
fn crash_at<S: TestDb>(store: &S, clock: &ManualClock, id: &str, point: &str) {
    let (store, clock, id, point) = (store.clone(), clock.clone(), id.to_owned(), point.to_owned());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let store = store.another_pool().await.expect("reopen");
            let hooks = Arc::new(Hooks::default());
            let mut reached = hooks.stop_at(&point).await;
            let engine = engine(store, &clock, &hooks);
            let starter = tokio::spawn(async move { engine.start::<Steps>(&id, &input("x", false)).await.map(|_| ()) });
            reached.recv().await.expect("stop point reached");
            drop(starter);
        });
        rt.shutdown_timeout(Duration::from_millis(100));
    })
    .join()
    .expect("crashing worker");
}

async fn runs_each_step_once<S: TestDb>(store: S) {
    let (clock, hooks) = (clock(), Arc::new(Hooks::default()));
    let engine = engine(store.clone(), &clock, &hooks);
    let handle = engine.start::<Steps>("wf-1", &input("x", false)).await.unwrap();
    assert!(!handle.attached());
    let outcome = handle.wait(WAIT).await.unwrap().expect("finished");
    assert_eq!(outcome, Outcome::Completed(serde_json::json!("done:x")));
    assert_eq!(store.effects("wf-1").await.unwrap(), ["a", "b", "c"]);
    assert_eq!(hooks.external_calls.load(Ordering::SeqCst), 2);
    let view = engine.workflow("wf-1").await.unwrap().unwrap();
    assert_eq!(view.workflow.state, WorkflowState::Completed);
    assert_eq!(view.workflow.lease_owner, None);
    let keys: Vec<_> = view.steps.iter().map(|s| (s.step_key.as_str(), s.status)).collect();
    for key in ["a", "e1", "b", "e2", "c"] {
        assert!(keys.contains(&(key, StepStatus::Completed)), "{key} in {keys:?}");
    }
    // Its compensations never ran and never will: the completed row keeps no list of them (issue 34's bytes).
    assert_eq!(store.compensations("wf-1").await.unwrap(), []);
    assert!(view.compensations.is_empty(), "{:?}", view.compensations);
    // A second start with the same input attaches and gets the stored result without running anything.
    let again = engine.start::<Steps>("wf-1", &input("x", false)).await.unwrap();
    assert!(again.attached());
    assert_eq!(again.wait(WAIT).await.unwrap(), Some(outcome));
    assert_eq!(store.effects("wf-1").await.unwrap(), ["a", "b", "c"]);
    assert!(matches!(engine.start::<Steps>("wf-1", &input("y", false)).await, Err(Error::Conflict { .. })));
}

async fn resumes_after_a_dropped_worker<S: TestDb>(store: S) {
    for point in ["e1", "b", "e2"] {
        let id = format!("crash-{point}");
        let clock = clock();
        crash_at(&store, &clock, &id, point);
        let row = store.workflow(&id).await.unwrap().expect("recorded before the crash");
        assert_eq!(row.state, WorkflowState::Running);
        let hooks = Arc::new(Hooks::default());
        let survivor = engine(store.another_pool().await.unwrap(), &clock, &hooks);
        assert_eq!(survivor.recover_once().await.unwrap(), 0, "{point}: the lease still holds");
        clock.advance(LEASE_MS + 1);
        assert_eq!(survivor.recover_once().await.unwrap(), 1, "{point}: claimed after the lease expired");
        let outcome = survivor.wait(&id, WAIT).await.unwrap().expect("finished");
        assert_eq!(outcome, Outcome::Completed(serde_json::json!("done:x")), "{point}");
        assert_eq!(store.effects(&id).await.unwrap(), ["a", "b", "c"], "{point}: each effect once");
        let seen = hooks.previous_seen.lock().unwrap().clone();
        if point != "e2" {
            assert_eq!(seen, [Previous::Unknown], "{point}: e1 is told its outcome is unknown");
        }
        let row = store.workflow(&id).await.unwrap().unwrap();
        assert_eq!(row.lease_epoch, 2);
    }
}

async fn racing_workers_run_it_once<S: TestDb>(store: S) {
    let clock = clock();
    crash_at(&store, &clock, "race", "e1");
    clock.advance(LEASE_MS + 1);
    let (h1, h2) = (Arc::new(Hooks::default()), Arc::new(Hooks::default()));
    let w1 = engine(store.another_pool().await.unwrap(), &clock, &h1);
    let w2 = engine(store.another_pool().await.unwrap(), &clock, &h2);
    let (c1, c2) = tokio::join!(w1.recover_once(), w2.recover_once());
    assert_eq!(c1.unwrap() + c2.unwrap(), 1, "exactly one worker claims it");
    let outcome = w1.wait("race", WAIT).await.unwrap();
    assert!(matches!(outcome, Some(Outcome::Completed(_))));
    assert_eq!(store.effects("race").await.unwrap(), ["a", "b", "c"]);
    let calls = h1.external_calls.load(Ordering::SeqCst) + h2.external_calls.load(Ordering::SeqCst);
    assert_eq!(calls, 2);
}

async fn a_fenced_worker_commits_nothing<S: TestDb>(store: S) {
    let clock = clock();
    let (old_hooks, new_hooks) = (Arc::new(Hooks::default()), Arc::new(Hooks::default()));
    let old = engine(store.another_pool().await.unwrap(), &clock, &old_hooks);
    let mut reached = old_hooks.stop_at("e1").await;
    let starter = {
        let old = old.clone();
        tokio::spawn(async move { old.start::<Steps>("fenced", &input("x", false)).await.map(|_| ()) })
    };
    reached.recv().await.unwrap();
    starter.await.unwrap().unwrap();
    clock.advance(LEASE_MS + 1);
    let new = engine(store.another_pool().await.unwrap(), &clock, &new_hooks);
    assert_eq!(new.recover_once().await.unwrap(), 1);
    assert!(matches!(new.wait("fenced", WAIT).await.unwrap(), Some(Outcome::Completed(_))));
    // The old worker wakes up and tries to go on: its next commit (b, e2's intent) must be refused.
    old_hooks.resume.notify_one();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.effects("fenced").await.unwrap(), ["a", "b", "c"]);
    assert_eq!(old_hooks.external_calls.load(Ordering::SeqCst), 1, "the old worker's e1 call ran");
    let row = store.workflow("fenced").await.unwrap().unwrap();
    assert_eq!(row.state, WorkflowState::Completed);
}

async fn compensations_run_in_reverse<S: TestDb>(store: S) {
    let (clock, hooks) = (clock(), Arc::new(Hooks::default()));
    let engine = engine(store.clone(), &clock, &hooks);
    let outcome = engine.start::<Steps>("comp", &input("x", true)).await.unwrap().wait(WAIT).await.unwrap();
    let Some(Outcome::Failed(failure)) = outcome else { panic!("expected a failure, got {outcome:?}") };
    assert_eq!(failure.code, "boom");
    // `c` and `boom` share an atomic phase: boom's failure rolled c back with it.
    assert_eq!(store.effects("comp").await.unwrap(), ["a", "b", "undo:b", "undo:e1", "undo:a"]);
    let view = engine.workflow("comp").await.unwrap().unwrap();
    assert_eq!(view.workflow.state, WorkflowState::Failed);
    assert!(view.compensations.iter().all(|c| c.status == CompensationStatus::Done));
    assert!(engine.retry("comp").await.is_err(), "a compensated workflow cannot run forward again");
}

async fn a_failing_compensation_ends_compensation_failed<S: TestDb>(store: S) {
    let (clock, hooks) = (clock(), Arc::new(Hooks::default()));
    hooks.fail_compensations.store(true, Ordering::SeqCst);
    let engine = engine(store.clone(), &clock, &hooks);
    let outcome = engine.start::<Steps>("stuck", &input("x", true)).await.unwrap().wait(WAIT).await.unwrap();
    let Some(Outcome::CompensationFailed(failure)) = outcome else { panic!("got {outcome:?}") };
    assert_eq!(failure.code, "boom");
    assert_eq!(failure.details["compensation"]["failure"]["code"], "retries_exhausted");
    assert_eq!(store.effects("stuck").await.unwrap(), ["a", "b"]);
    // The operator fixes the cause and retries: the compensations finish.
    hooks.fail_compensations.store(false, Ordering::SeqCst);
    let reopened = engine.retry("stuck").await.unwrap();
    assert_eq!(reopened.state, WorkflowState::Compensating);
    assert_eq!(engine.recover_once().await.unwrap(), 1);
    assert!(matches!(engine.wait("stuck", WAIT).await.unwrap(), Some(Outcome::Failed(_))));
    assert_eq!(store.effects("stuck").await.unwrap(), ["a", "b", "undo:b", "undo:e1", "undo:a"]);
}

async fn fifty_concurrent_starts_run_once<S: TestDb>(store: S) {
    let clock = clock();
    let (h1, h2) = (Arc::new(Hooks::default()), Arc::new(Hooks::default()));
    let engines = [
        engine(store.another_pool().await.unwrap(), &clock, &h1),
        engine(store.another_pool().await.unwrap(), &clock, &h2),
    ];
    let mut tasks = Vec::new();
    for i in 0..50 {
        let engine = engines[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let handle = engine.start::<Steps>("storm", &input("x", false)).await?;
            handle.wait(WAIT).await
        }));
    }
    for task in tasks {
        let outcome = task.await.unwrap().unwrap();
        assert_eq!(outcome, Some(Outcome::Completed(serde_json::json!("done:x"))));
    }
    assert_eq!(store.effects("storm").await.unwrap(), ["a", "b", "c"]);
    let calls = h1.external_calls.load(Ordering::SeqCst) + h2.external_calls.load(Ordering::SeqCst);
    assert_eq!(calls, 2, "the external steps ran once");
    for engine in &engines {
        assert!(matches!(engine.start::<Steps>("storm", &input("other", false)).await, Err(Error::Conflict { .. })));
    }
}

async fn cancel_fences_the_runner_and_compensates<S: TestDb>(store: S) {
    let clock = clock();
    let (old_hooks, hooks) = (Arc::new(Hooks::default()), Arc::new(Hooks::default()));
    let old = engine(store.another_pool().await.unwrap(), &clock, &old_hooks);
    let mut reached = old_hooks.stop_at("e2").await;
    let _handle = old.start::<Steps>("cancel", &input("x", false)).await.unwrap();
    reached.recv().await.unwrap();
    let operator = engine(store.another_pool().await.unwrap(), &clock, &hooks);
    assert_eq!(operator.cancel("cancel").await.unwrap().state, WorkflowState::Compensating);
    assert_eq!(operator.recover_once().await.unwrap(), 1);
    let outcome = operator.wait("cancel", WAIT).await.unwrap();
    assert!(matches!(outcome, Some(Outcome::Cancelled(_))), "{outcome:?}");
    old_hooks.resume.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.effects("cancel").await.unwrap(), ["a", "b", "undo:b", "undo:e1", "undo:a"]);
    assert!(operator.cancel("cancel").await.is_err(), "a cancelled workflow cannot be cancelled again");
}

/// An external step that fails retryably `fail_times` times, with a wait too long to sleep in-process.
struct Flaky;

impl<S: TestDb> Workflow<S> for Flaky {
    const NAME: &'static str = "flaky";
    type Input = u32;
    type Output = u32;

    async fn run(&self, ctx: &mut WorkflowContext<S>, fail_times: u32) -> Result<u32, Interrupt> {
        let policy = RetryPolicy { initial_interval: Duration::from_secs(30), jitter: false, ..RetryPolicy::default() };
        ctx.external(step("call").retry(policy), |attempt| async move {
            if attempt.number <= fail_times {
                Err(StepError::Retryable(format!("attempt {} failed", attempt.number)))
            } else {
                Ok(attempt.number)
            }
        })
        .await
    }
}

async fn long_waits_are_persisted<S: TestDb>(store: S) {
    let (clock, hooks) = (clock(), Arc::new(Hooks::default()));
    let engine = engine(store.clone(), &clock, &hooks);
    let start = clock.now_ms_for_tests();
    let handle = engine.start::<Flaky>("flaky", &1).await.unwrap();
    assert_eq!(handle.wait(Duration::from_millis(200)).await.unwrap(), None);
    let row = store.workflow("flaky").await.unwrap().unwrap();
    assert_eq!(row.state, WorkflowState::Running);
    assert_eq!(row.next_attempt_at, start + 30_000, "the wait is in the database");
    assert_eq!(row.lease_owner, None, "the workflow was released");
    let steps = store.steps("flaky").await.unwrap();
    assert_eq!((steps[0].status, steps[0].attempts), (StepStatus::Retrying, 1));
    assert_eq!(engine.recover_once().await.unwrap(), 0, "not due yet");
    clock.advance(30_000);
    assert_eq!(engine.recover_once().await.unwrap(), 1);
    assert_eq!(engine.wait("flaky", WAIT).await.unwrap(), Some(Outcome::Completed(serde_json::json!(2))));
}

/// A body that refuses itself after a transactional step, before its first commit or (`after_commit`) after an
/// external step committed its intent.
struct Refusing;

impl<S: TestDb> Workflow<S> for Refusing {
    const NAME: &'static str = "refusing";
    type Input = bool;
    type Output = ();

    async fn run(&self, ctx: &mut WorkflowContext<S>, after_commit: bool) -> Result<(), Interrupt> {
        let id = ctx.workflow_id().to_owned();
        if after_commit {
            ctx.external("call", |_| async { Ok(()) }).await?;
        }
        ctx.transactional(step("write").compensate_with("undo", ()), effect_step::<S>(id, "written")).await?;
        Err(Interrupt::Refused(onceflow_engine::Failure::new("refused", "not today")))
    }
}

/// Before the first commit a refusal records nothing: the start is refused and the phase's writes roll back.
/// After it, a refusal fails the workflow like any terminal failure.
async fn a_refusal_before_the_first_commit_records_nothing<S: TestDb>(store: S) {
    let (clock, hooks) = (clock(), Arc::new(Hooks::default()));
    let engine = engine(store.clone(), &clock, &hooks);
    match engine.start::<Refusing>("refused", &false).await {
        Err(Error::Refused(f)) => assert_eq!(f.code, "refused"),
        other => panic!("expected a refused start, got {:?}", other.map(|h| h.workflow_id().to_owned())),
    }
    assert_eq!(store.workflow("refused").await.unwrap(), None, "nothing of the workflow is recorded");
    assert!(store.effects("refused").await.unwrap().is_empty(), "the phase's write rolled back");

    let handle = engine.start::<Refusing>("recorded", &true).await.unwrap();
    let outcome = handle.wait(WAIT).await.unwrap().expect("finished");
    assert!(matches!(&outcome, Outcome::Failed(f) if f.code == "refused"), "{outcome:?}");
    assert_eq!(store.workflow("recorded").await.unwrap().unwrap().state, WorkflowState::Failed);
}

/// A body whose first transactional step waits for `resume` (after telling `reached`), then takes a second. Its
/// input is only there to be hashed (two inputs, two workflows' worth of one id).
struct Paused {
    reached: Arc<tokio::sync::Notify>,
    resume: Arc<tokio::sync::Notify>,
}

impl<S: TestDb> Workflow<S> for Paused {
    const NAME: &'static str = "paused";
    type Input = String;
    type Output = ();

    async fn run(&self, ctx: &mut WorkflowContext<S>, _label: String) -> Result<(), Interrupt> {
        let id = ctx.workflow_id().to_owned();
        let (reached, resume) = (self.reached.clone(), self.resume.clone());
        let effect = effect_step::<S>(id.clone(), "first");
        ctx.transactional("first", move |conn| -> onceflow_engine::BoxFuture<'_, _> {
            Box::pin(async move {
                effect(conn).await?;
                reached.notify_one();
                resume.notified().await;
                Ok(())
            })
        })
        .await?;
        ctx.transactional("second", effect_step::<S>(id, "second")).await
    }
}

/// A shutdown that stops a workflow before its first commit records nothing of it (its open phase is not
/// committed half-done) and tells the start so.
async fn a_shutdown_before_the_first_commit_records_nothing<S: TestDb>(store: S) {
    let (reached, resume) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let engine =
        Engine::builder(store.clone()).register(Paused { reached: reached.clone(), resume: resume.clone() }).build();
    let starter = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.start::<Paused>("paused", &"x".to_owned()).await.map(|_| ()) })
    };
    reached.notified().await;
    let stopping = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.shutdown(Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    resume.notify_one();
    assert!(matches!(starter.await.unwrap(), Err(Error::ShuttingDown)));
    stopping.await.unwrap().unwrap();
    assert_eq!(store.workflow("paused").await.unwrap(), None, "nothing of the workflow is recorded");
    assert!(store.effects("paused").await.unwrap().is_empty(), "the open phase was not committed");
}

/// A new version of `steps` whose first step became an external call: its history no longer matches.
struct StepsChanged;

impl<S: TestDb> Workflow<S> for StepsChanged {
    const NAME: &'static str = "steps";
    type Input = StepsInput;
    type Output = String;

    async fn run(&self, ctx: &mut WorkflowContext<S>, _input: StepsInput) -> Result<String, Interrupt> {
        ctx.external("a", |_| async { Ok(()) }).await?;
        Ok("changed".to_owned())
    }
}

async fn a_changed_step_is_a_mismatch_not_a_replay<S: TestDb>(store: S) {
    let clock = clock();
    crash_at(&store, &clock, "changed", "e1");
    clock.advance(LEASE_MS + 1);
    let changed =
        Engine::builder(store.another_pool().await.unwrap()).register(StepsChanged).clock(clock.clone()).build();
    assert_eq!(changed.recover_once().await.unwrap(), 1);
    let outcome = changed.wait("changed", WAIT).await.unwrap();
    let Some(Outcome::Failed(failure)) = outcome else { panic!("got {outcome:?}") };
    assert_eq!(failure.code, "step_mismatch");
    assert!(failure.message.contains("a (transactional)"), "{}", failure.message);
    assert_eq!(store.effects("changed").await.unwrap(), ["a"], "parked for an operator, nothing compensated");
    // Once the right code is deployed, the operator retries and the workflow finishes.
    let hooks = Arc::new(Hooks::default());
    let fixed = engine(store.another_pool().await.unwrap(), &clock, &hooks);
    assert_eq!(fixed.retry("changed").await.unwrap().state, WorkflowState::Running);
    assert_eq!(fixed.recover_once().await.unwrap(), 1);
    assert!(matches!(fixed.wait("changed", WAIT).await.unwrap(), Some(Outcome::Completed(_))));
    assert_eq!(store.effects("changed").await.unwrap(), ["a", "b", "c"]);
}

trait NowForTests {
    fn now_ms_for_tests(&self) -> i64;
}

impl NowForTests for ManualClock {
    fn now_ms_for_tests(&self) -> i64 {
        onceflow_engine::clock::Clock::now_ms(self)
    }
}

on_every_backend!(
    runs_each_step_once,
    resumes_after_a_dropped_worker,
    racing_workers_run_it_once,
    a_fenced_worker_commits_nothing,
    compensations_run_in_reverse,
    a_failing_compensation_ends_compensation_failed,
    fifty_concurrent_starts_run_once,
    cancel_fences_the_runner_and_compensates,
    long_waits_are_persisted,
    a_changed_step_is_a_mismatch_not_a_replay,
    a_refusal_before_the_first_commit_records_nothing,
    a_shutdown_before_the_first_commit_records_nothing,
);

/// A waiter in another process hears of the end through Postgres `NOTIFY`, not by polling: its poll interval
/// is far longer than the test allows.
#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_elsewhere_is_notified_on_postgres() {
    let Some(store) = onceflow_tests::pg_store().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let clock = clock();
    let hooks = Arc::new(Hooks::default());
    let runner = engine(store.another_pool().await.unwrap(), &clock, &hooks);
    let mut reached = hooks.stop_at("e2").await;
    runner.start::<Steps>("remote", &input("x", false)).await.unwrap();
    reached.recv().await.unwrap();
    let waiter = Engine::builder(store.another_pool().await.unwrap())
        .register(Steps { hooks: Arc::new(Hooks::default()) })
        .config(EngineConfig { poll_interval: Duration::from_secs(60), ..EngineConfig::default() })
        .build();
    let wait = tokio::spawn(async move { waiter.wait("remote", Duration::from_secs(30)).await });
    // The waiter listens before it flags the workflow: once the flag is set, a NOTIFY cannot be missed.
    while !store.workflow("remote").await.unwrap().unwrap().notify {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = std::time::Instant::now();
    hooks.resume.notify_one();
    let outcome = wait.await.unwrap().unwrap();
    assert!(matches!(outcome, Some(Outcome::Completed(_))));
    assert!(started.elapsed() < Duration::from_secs(10), "woken by NOTIFY, not by the 60 s poll");
}

/// Another process (a pool of its own) starts `steps` as `id` with input `label`, is stopped in e2 and shuts
/// down: e2 never returns, the grace runs out and the lease is released anyway. `id` is left running, its lease
/// free; returns that process's engine.
async fn left_running_by_a_stopped_process<S: TestDb>(
    store: &S,
    clock: &ManualClock,
    id: &str,
    label: &str,
) -> Engine<S> {
    let hooks = Arc::new(Hooks::default());
    let old = engine(store.another_pool().await.unwrap(), clock, &hooks);
    let mut reached = hooks.stop_at("e2").await;
    old.start::<Steps>(id, &input(label, false)).await.unwrap();
    reached.recv().await.unwrap();
    old.shutdown(Duration::from_millis(100)).await.unwrap();
    old
}

async fn shutdown_releases_leases_at_once<S: TestDb>(store: S) {
    let clock = clock();
    let old = left_running_by_a_stopped_process(&store, &clock, "shutdown", "x").await;
    let row = store.workflow("shutdown").await.unwrap().unwrap();
    assert_eq!((row.state, row.lease_owner.as_deref()), (WorkflowState::Running, None));
    assert!(matches!(old.start::<Steps>("other", &input("x", false)).await, Err(Error::ShuttingDown)));
    // Another process takes over without waiting for the lease to expire (the clock has not moved).
    let next = engine(store.another_pool().await.unwrap(), &clock, &Arc::new(Hooks::default()));
    assert_eq!(next.recover_once().await.unwrap(), 1);
    assert!(matches!(next.wait("shutdown", WAIT).await.unwrap(), Some(Outcome::Completed(_))));
    assert_eq!(store.effects("shutdown").await.unwrap(), ["a", "b", "c"]);
}

/// A start that joined a run of its input in this process, which then lost the id to a workflow of another input
/// recorded elsewhere, is that workflow's conflict — also when this process has meanwhile claimed that workflow
/// and drives it (the waiter must not take the other input's run for its own and wait on it).
async fn a_joined_start_is_not_held_by_another_inputs_run_here<S: TestDb>(store: S) {
    let clock = clock();
    // Another process records `w` with input A, stops in e2 and shuts down: `w` is running, its lease free.
    left_running_by_a_stopped_process(&store, &clock, "w", "A").await;
    // Here: a start of `w` with another input runs until inside its first phase; a second start joins it.
    let (reached, resume) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let hooks = Arc::new(Hooks::default());
    let here = Engine::builder(store.clone())
        .register(Steps { hooks: hooks.clone() })
        .register(Paused { reached: reached.clone(), resume: resume.clone() })
        .clock(clock.clone())
        .build();
    let first = {
        let here = here.clone();
        tokio::spawn(async move { here.start::<Paused>("w", &"B".to_owned()).await.map(|_| ()) })
    };
    reached.notified().await;
    let joined = here.start::<Paused>("w", &"B".to_owned()).await.unwrap();
    // This process claims `w` (input A) and drives it, held in e2; then the first start's run loses the id.
    let mut held = hooks.stop_at("e2").await;
    assert_eq!(here.recover_once().await.unwrap(), 1);
    held.recv().await.unwrap();
    resume.notify_one();
    assert!(matches!(first.await.unwrap(), Err(Error::Conflict { .. })));
    let waited = joined.wait(Duration::from_secs(2)).await;
    assert!(matches!(waited, Err(Error::Conflict { .. })), "{waited:?}");
    hooks.resume.notify_one();
    assert!(matches!(here.wait("w", WAIT).await.unwrap(), Some(Outcome::Completed(_))));
}

on_every_backend!(shutdown_releases_leases_at_once);

// Not on SQLite: its one writer is held by the first start's open phase, so nothing claims a workflow meanwhile.
mod a_joined_start_is_not_held_by_another_inputs_run_here {
    onceflow_tests::backend_test!(postgres, a_joined_start_is_not_held_by_another_inputs_run_here);
    onceflow_tests::backend_test!(mysql, a_joined_start_is_not_held_by_another_inputs_run_here);
}
