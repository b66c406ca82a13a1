//! Liveness of leases, each on SQLite, Postgres and MySQL: a process heartbeats only the workflows a live task of
//! its own drives, so a run that stopped (here: panicked) lets its lease expire and the workflow is resumed by
//! another process (or this one) while the process that lost it keeps running.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use onceflow_engine::clock::ManualClock;
use onceflow_engine::store::{Lease, StepStatus, WorkflowRecord, WorkflowState};
use onceflow_engine::{Engine, EngineConfig, Interrupt, Outcome, Previous, Workflow, WorkflowContext};
use onceflow_tests::{TestDb, effect_step, on_every_backend};
use tokio::sync::{Semaphore, mpsc};

const LEASE: Duration = Duration::from_millis(400);
/// Far more than a few lease lengths: before the fix the lease never expired at all.
const BOUND: Duration = Duration::from_secs(10);

/// `a` (tx), `e` (external), then a panic on the first run only, then `b` (tx).
struct PanicsOnce {
    panicked: Arc<AtomicBool>,
}

impl<S: TestDb> Workflow<S> for PanicsOnce {
    const NAME: &'static str = "panics_once";
    type Input = ();
    type Output = ();

    async fn run(&self, ctx: &mut WorkflowContext<S>, (): ()) -> Result<(), Interrupt> {
        let id = ctx.workflow_id().to_owned();
        ctx.transactional("a", effect_step::<S>(id.clone(), "a")).await?;
        // An external step commits the workflow (and `a`) before its call: the start returns, the row exists.
        ctx.external("e", |_| async { Ok(()) }).await?;
        if !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("the first run of a panics_once workflow panics (as the liveness test asks)");
        }
        ctx.transactional("b", effect_step::<S>(id, "b")).await
    }
}

fn live_engine<S: TestDb>(store: S, panicked: &Arc<AtomicBool>) -> Engine<S> {
    let config = EngineConfig { lease: LEASE, poll_interval: Duration::from_millis(100), ..EngineConfig::default() };
    Engine::builder(store).register(PanicsOnce { panicked: panicked.clone() }).config(config).build()
}

async fn a_panicked_run_is_resumed_elsewhere<S: TestDb>(store: S) {
    let panicked = Arc::new(AtomicBool::new(false));
    let a = live_engine(store.another_pool().await.unwrap(), &panicked);
    a.spawn_background();
    a.start::<PanicsOnce>("panics", &()).await.unwrap();
    let asked = Instant::now();
    while !panicked.load(Ordering::SeqCst) {
        assert!(asked.elapsed() < BOUND, "the run did not reach its panic");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Engine A lives on (its heartbeat and recovery loop run); B is another process on the same database.
    let b = live_engine(store.another_pool().await.unwrap(), &panicked);
    b.spawn_background();
    let outcome = b.wait("panics", BOUND).await.unwrap();
    let row = store.workflow("panics").await.unwrap().unwrap();
    assert_eq!(
        outcome,
        Some(Outcome::Completed(serde_json::Value::Null)),
        "not resumed within {BOUND:?} after the panic: {row:?}"
    );
    assert_eq!(row.state, WorkflowState::Completed);
    assert!(row.lease_epoch >= 2, "claimed again after the panicked run: {row:?}");
    assert_eq!(store.effects("panics").await.unwrap(), ["a", "b"]);
    a.shutdown(Duration::from_millis(100)).await.unwrap();
    b.shutdown(Duration::from_millis(100)).await.unwrap();
}

/// Waits in its external step until the test lets each run go on, telling the test each time it gets there.
struct Gated {
    reached: mpsc::UnboundedSender<Previous>,
    gate: Arc<Semaphore>,
}

impl<S: TestDb> Workflow<S> for Gated {
    const NAME: &'static str = "gated";
    type Input = ();
    type Output = ();

    async fn run(&self, ctx: &mut WorkflowContext<S>, (): ()) -> Result<(), Interrupt> {
        let id = ctx.workflow_id().to_owned();
        ctx.transactional("a", effect_step::<S>(id.clone(), "a")).await?;
        let (reached, gate) = (&self.reached, &self.gate);
        ctx.external("e", |attempt| async move {
            let _ = reached.send(attempt.previous);
            gate.acquire().await.expect("gate").forget();
            Ok(())
        })
        .await?;
        ctx.transactional("b", effect_step::<S>(id, "b")).await
    }
}

/// Run 1 of a workflow is stuck in a call until its lease expires; this same process claims it again (run 2).
/// When run 1 then ends (fenced), run 2 must still count as driven here: the heartbeat keeps extending its lease.
async fn an_older_run_ending_keeps_the_newer_run_driven<S: TestDb>(store: S) {
    const LEASE_MS: i64 = 10_000;
    let clock = ManualClock::new(1_800_000_000_000);
    let (tx, mut reached) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let config = EngineConfig {
        lease: Duration::from_millis(LEASE_MS as u64),
        poll_interval: Duration::from_millis(50),
        ..EngineConfig::default()
    };
    let engine = Engine::builder(store.another_pool().await.unwrap())
        .register(Gated { reached: tx, gate: gate.clone() })
        .clock(clock.clone())
        .config(config)
        .build();
    engine.start::<Gated>("gated", &()).await.unwrap();
    assert_eq!(reached.recv().await, Some(Previous::None), "run 1 is in its call");
    clock.advance(LEASE_MS + 1);
    assert_eq!(engine.recover_once().await.unwrap(), 1, "run 2 claims the expired lease");
    assert_eq!(reached.recv().await, Some(Previous::Unknown), "run 2 is in its call");
    // Run 1 goes on (the semaphore is fair: it waited first): its commit is fenced (lease lost) and its task
    // ends, while run 2 is still in its call.
    gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !store.steps("gated").await.unwrap().iter().any(|s| s.step_key == "e" && s.status == StepStatus::Completed),
        "run 1 was fenced"
    );
    // Time passes with run 2 still in its call: the heartbeat must extend run 2's lease.
    let before = store.workflow("gated").await.unwrap().unwrap();
    assert_eq!(before.lease_epoch, 2);
    clock.advance(LEASE_MS / 2);
    let background = engine.spawn_background();
    let target = onceflow_engine::clock::Clock::now_ms(&clock) + LEASE_MS;
    let asked = Instant::now();
    loop {
        let row = store.workflow("gated").await.unwrap().unwrap();
        if row.lease_expires_at == Some(target) {
            break;
        }
        assert!(asked.elapsed() < Duration::from_secs(5), "run 2's lease was not heartbeated: {row:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gate.add_permits(1);
    assert_eq!(engine.wait("gated", BOUND).await.unwrap(), Some(Outcome::Completed(serde_json::Value::Null)));
    assert_eq!(store.effects("gated").await.unwrap(), ["a", "b"]);
    engine.shutdown(Duration::from_millis(100)).await.unwrap();
    background.await.unwrap();
}

fn leased(id: &str, owner: &str, lease_expires_at: i64, state: WorkflowState) -> WorkflowRecord {
    WorkflowRecord {
        workflow_id: id.to_owned(),
        name: "t".to_owned(),
        input: "{}".to_owned(),
        input_hash: "h".to_owned(),
        state,
        output: None,
        error: None,
        lease_owner: Some(owner.to_owned()),
        lease_expires_at: Some(lease_expires_at),
        lease_epoch: 1,
        next_attempt_at: 0,
        notify: false,
        created_at: 0,
        updated_at: 0,
        tenant: None,
        trace: None,
    }
}

/// The store's heartbeat extends only the listed workflows that `owner` still holds, unexpired and unfinished;
/// the other leases of `owner` (runs that stopped) are left to expire.
async fn the_heartbeat_extends_only_the_listed_leases<S: TestDb>(store: S) {
    let rows = [
        leased("driven", "me", 1_000, WorkflowState::Running),
        leased("compensating", "me", 1_000, WorkflowState::Compensating),
        leased("stopped", "me", 1_000, WorkflowState::Running),
        leased("theirs", "other", 1_000, WorkflowState::Running),
        leased("expired", "me", 50, WorkflowState::Running),
        leased("done", "me", 1_000, WorkflowState::Completed),
    ];
    let mut tx = store.begin().await.unwrap();
    for row in &rows {
        store.insert_workflow(&mut tx, row, &[]).await.unwrap();
    }
    tx.commit().await.unwrap();
    assert_eq!(store.heartbeat("me", &[], Lease::at(100, 1_900)).await.unwrap(), 0);
    // More ids than one MySQL statement lists, most of them not in the table.
    let mut ids: Vec<String> = (0..1_200).map(|i| format!("absent-{i}")).collect();
    ids.extend(["driven", "theirs", "expired", "done"].map(String::from));
    ids.insert(600, "compensating".to_owned());
    assert_eq!(store.heartbeat("me", &ids, Lease::at(100, 1_900)).await.unwrap(), 2);
    let expected = [2_000, 2_000, 1_000, 1_000, 50, 1_000];
    for (row, expected) in rows.iter().zip(expected) {
        let stored = store.workflow(&row.workflow_id).await.unwrap().unwrap();
        assert_eq!(stored.lease_expires_at, Some(expected), "{}", row.workflow_id);
    }
}

/// Every connection there is, held: the store's held writers, then the rest of its pool.
async fn take_every_connection<S: TestDb>(
    store: &S,
) -> (Vec<onceflow_engine::store::Writer<'_, S::Db>>, Vec<sqlx::pool::PoolConnection<S::Db>>) {
    let mut writers = Vec::new();
    while let Ok(Ok(w)) = tokio::time::timeout(Duration::from_millis(200), store.writer()).await {
        writers.push(w);
    }
    let mut connections = Vec::new();
    while let Ok(Ok(c)) = tokio::time::timeout(Duration::from_millis(200), store.pool().acquire()).await {
        connections.push(c);
    }
    (writers, connections)
}

/// Every connection of the pool taken (by requests waiting, by commits held): the heartbeat still keeps the lease
/// of a run in flight, on a connection of its own, so no other claim takes the workflow away from its live run.
async fn a_saturated_pool_does_not_starve_the_heartbeat<S: TestDb>(store: S) {
    let (reached, mut reach) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let config = EngineConfig { lease: LEASE, poll_interval: Duration::from_millis(100), ..EngineConfig::default() };
    let engine = Engine::builder(store.clone()).register(Gated { reached, gate: gate.clone() }).config(config).build();
    engine.spawn_background();
    engine.start::<Gated>("starved", &()).await.unwrap();
    tokio::time::timeout(BOUND, reach.recv()).await.expect("the run reached its call");
    let (writers, connections) = take_every_connection(&store).await;
    // Several leases long; then the lease, read as another process would, is still live.
    tokio::time::sleep(LEASE * 5).await;
    let other = store.another_pool().await.unwrap();
    let row = other.workflow("starved").await.unwrap().unwrap();
    let now =
        i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap();
    assert!(
        row.lease_expires_at.is_some_and(|until| until > now),
        "the lease expired while the pool was taken: {:?} <= {now}",
        row.lease_expires_at
    );
    drop((writers, connections));
    gate.add_permits(1);
    let outcome = engine.wait("starved", BOUND).await.unwrap();
    assert_eq!(outcome, Some(Outcome::Completed(serde_json::Value::Null)));
    let row = store.workflow("starved").await.unwrap().unwrap();
    assert_eq!(row.lease_epoch, 1, "the lease expired while the pool was taken and the workflow was claimed again");
    engine.shutdown(Duration::from_millis(100)).await.unwrap();
}

mod a_saturated_pool_does_not_starve_the_heartbeat {
    onceflow_tests::backend_test!(postgres, a_saturated_pool_does_not_starve_the_heartbeat);
    onceflow_tests::backend_test!(mysql, a_saturated_pool_does_not_starve_the_heartbeat);
}

/// Every connection of the pool taken: the recovery scan still claims a workflow whose run died (its lease
/// expired), on a connection of its own, instead of failing on the pool's timeout scan after scan.
async fn a_saturated_pool_does_not_starve_the_recovery_scan<S: TestDb>(store: S) {
    let (reached, mut reach) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let config = EngineConfig { lease: LEASE, ..EngineConfig::default() };
    let gated = || Gated { reached: reached.clone(), gate: gate.clone() };
    // A process whose run stops in its call and that never heartbeats (it died, as far as the lease can tell).
    let dead = Engine::builder(store.another_pool().await.unwrap()).register(gated()).config(config.clone()).build();
    dead.start::<Gated>("orphan", &()).await.unwrap();
    tokio::time::timeout(BOUND, reach.recv()).await.expect("the first run reached its call");
    tokio::time::sleep(LEASE * 2).await;
    let engine = Engine::builder(store.clone()).register(gated()).config(config).build();
    let (writers, connections) = take_every_connection(&store).await;
    let claimed = tokio::time::timeout(BOUND, engine.recover_once()).await.expect("the scan returned");
    assert_eq!(claimed.expect("the scan ran while the pool was taken"), 1);
    drop((writers, connections));
    tokio::time::timeout(BOUND, reach.recv()).await.expect("the second run reached its call");
    gate.add_permits(2);
    let outcome = engine.wait("orphan", BOUND).await.unwrap();
    assert_eq!(outcome, Some(Outcome::Completed(serde_json::Value::Null)));
    assert_eq!(store.workflow("orphan").await.unwrap().unwrap().lease_epoch, 2);
}

mod a_saturated_pool_does_not_starve_the_recovery_scan {
    onceflow_tests::backend_test!(postgres, a_saturated_pool_does_not_starve_the_recovery_scan);
    onceflow_tests::backend_test!(mysql, a_saturated_pool_does_not_starve_the_recovery_scan);
}

on_every_backend!(
    a_panicked_run_is_resumed_elsewhere,
    an_older_run_ending_keeps_the_newer_run_driven,
    the_heartbeat_extends_only_the_listed_leases,
);
