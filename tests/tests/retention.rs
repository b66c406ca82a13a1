//! The retention pass on SQLite, Postgres and MySQL, with a manual clock: each kind of row is deleted exactly
//! when its retention has passed and not a millisecond before; a dry run deletes nothing; a replay after the
//! response retention is `404 token_not_found`; an unfinished payment survives any number of passes; two
//! passes at once delete each row once, and payments go on while they run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use onceflow_engine::clock::{Clock, ManualClock};
use onceflow_engine::store::WorkflowState;
use onceflow_engine::{Engine, EngineConfig, Outcome};
use onceflow_payments::{
    MockChannel, MockChannelConfig, OrderStatus, PassReport, PaymentRequest, PaymentStatus, PaymentStore, Payments,
    Retention, TokenState, check_invariants, payment_workflow_id,
};
use onceflow_tests::ids::{cny, order_no, pay_request, request_no};
use onceflow_tests::{Hooks, Steps, StepsInput, TestDb, on_every_backend};

const T: &str = "default";
const ROUTE: &str = "/v1/payments";
const WAIT: Duration = Duration::from_secs(20);
const T0: i64 = 1_700_000_000_000;
const HOUR: i64 = 3_600_000;
/// The steps of a paid payment: `claim_token`, `insert_record`, `reserve_status`, `call_channel`, `confirm`.
const STEPS: u64 = 5;

/// Ttl 1 h, responses 2 h, histories 3 h: each kind falls due at its own time.
fn staggered() -> Retention {
    Retention {
        token_ttl: Duration::from_secs(3600),
        response_retention: Duration::from_secs(2 * 3600),
        history_retention: Duration::from_secs(3 * 3600),
    }
}

fn service<S: PaymentStore>(store: S, clock: &ManualClock, channel: MockChannel, r: Retention) -> Payments<S> {
    Payments::with_clock(store, Arc::new(channel), EngineConfig::default(), clock.clone()).with_retention(r)
}

fn request(order: &str) -> PaymentRequest {
    pay_request(order, 1000, None)
}

fn report(unused_tokens: u64, used_tokens: u64, workflows: u64, steps: u64) -> PassReport {
    PassReport { unused_tokens, used_tokens, workflows, steps, events: 0, dry_run: false }
}

fn code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap()["code"].as_str().unwrap_or_default().to_owned()
}

/// Moves `clock` to `at`, then checks that a dry run counts `expected` and deletes nothing, that a pass
/// deletes `expected`, and that the next pass finds nothing left.
async fn pass_at<S: PaymentStore>(p: &Payments<S>, clock: &ManualClock, at: i64, expected: PassReport, what: &str) {
    clock.advance(at - clock.now_ms());
    let dry = p.retention_pass(true).await.unwrap().unwrap();
    assert_eq!(dry, PassReport { dry_run: true, ..expected }, "{what}: the dry run");
    let again = p.retention_pass(true).await.unwrap().unwrap();
    assert_eq!(again, dry, "{what}: the dry run deleted nothing");
    assert_eq!(p.retention_pass(false).await.unwrap().unwrap(), expected, "{what}");
    assert_eq!(p.retention_pass(false).await.unwrap().unwrap(), report(0, 0, 0, 0), "{what}: each row once");
}

async fn each_kind_goes_exactly_when_its_retention_has_passed<S: TestDb + PaymentStore>(store: S) {
    let clock = ManualClock::new(T0);
    let p = service(store.clone(), &clock, MockChannel::reliable(), staggered());
    // A payment that never finishes: its charge is held at the channel.
    let held = MockChannel::new(MockChannelConfig { hold_ms: 3_600_000, ..MockChannelConfig::default() });
    let stalled = service(store.clone(), &clock, held, staggered());
    for order in ["O-1", "O-2"] {
        p.create_order(T, &order_no(order), 1000, &cny()).await.unwrap();
    }
    let unused = p.issue_token(T).await.unwrap();
    assert_eq!(unused.expires_at, T0 + HOUR, "the ttl is the configured one");
    let used = p.issue_token(T).await.unwrap().token;
    let first = p.pay(T, &used, ROUTE, &request("O-1"), WAIT).await.unwrap();
    assert_eq!(first.status, 201, "{}", first.body);
    let workflow = payment_workflow_id(&used);
    let steps = u64::try_from(store.steps(&workflow).await.unwrap().len()).unwrap();
    assert_eq!(steps, STEPS, "a payment's steps");
    let in_flight = stalled.issue_token(T).await.unwrap().token;
    let processing = stalled.pay(T, &in_flight, ROUTE, &request("O-2"), Duration::from_millis(300)).await.unwrap();
    assert_eq!(processing.status, 202, "{}", processing.body);

    pass_at(&p, &clock, T0 + HOUR - 1, report(0, 0, 0, 0), "a millisecond before the ttl").await;
    pass_at(&p, &clock, T0 + HOUR, report(1, 0, 0, 0), "at the ttl: the unused token").await;
    let late = p.pay(T, &unused.token, ROUTE, &request("O-2"), WAIT).await.unwrap();
    assert_eq!((late.status, code(&late.body)), (404, "token_not_found".to_owned()));

    pass_at(&p, &clock, T0 + 2 * HOUR - 1, report(0, 0, 0, 0), "a millisecond before the response retention").await;
    let replay = p.pay(T, &used, ROUTE, &request("O-1"), WAIT).await.unwrap();
    assert_eq!((replay.status, &replay.body, replay.replayed), (201, &first.body, true), "still replayed");
    pass_at(&p, &clock, T0 + 2 * HOUR, report(0, 1, 0, 0), "at the response retention: the used token").await;
    // The workflow is still kept (its history retention is longer), and still the token is gone.
    assert!(store.workflow(&workflow).await.unwrap().is_some());
    let gone = p.pay(T, &used, ROUTE, &request("O-1"), WAIT).await.unwrap();
    assert_eq!((gone.status, code(&gone.body)), (404, "token_not_found".to_owned()), "{}", gone.body);

    pass_at(&p, &clock, T0 + 3 * HOUR - 1, report(0, 0, 0, 0), "a millisecond before the history retention").await;
    pass_at(&p, &clock, T0 + 3 * HOUR, report(0, 0, 1, steps), "at the history retention: the workflow").await;
    assert!(store.workflow(&workflow).await.unwrap().is_none());
    assert!(store.steps(&workflow).await.unwrap().is_empty());
    let gone = p.pay(T, &used, ROUTE, &request("O-1"), WAIT).await.unwrap();
    assert_eq!((gone.status, code(&gone.body)), (404, "token_not_found".to_owned()), "{}", gone.body);

    // Orders and payment records are kept; the unfinished payment keeps everything, however late.
    pass_at(&p, &clock, T0 + 400 * 24 * HOUR, report(0, 0, 0, 0), "a year on").await;
    assert_eq!(p.order(T, &order_no("O-1")).await.unwrap().unwrap().status, OrderStatus::Paid);
    let paid = serde_json::from_str::<serde_json::Value>(&first.body).unwrap();
    let record = p.payment(T, &request_no(paid["request_no"].as_str().unwrap())).await.unwrap().unwrap();
    assert_eq!(record.status, PaymentStatus::Succeeded);
    let (token, _) = store.token_and_order(&in_flight, T, &order_no("O-2")).await.unwrap().unwrap();
    assert_eq!(token.state, TokenState::InUse);
    let running = store.workflow(&payment_workflow_id(&in_flight)).await.unwrap().unwrap();
    assert_eq!(running.state, WorkflowState::Running);
    assert_eq!(p.order(T, &order_no("O-2")).await.unwrap().unwrap().status, OrderStatus::Paying);
}

async fn a_replay_outlives_the_history<S: TestDb + PaymentStore>(store: S) {
    let clock = ManualClock::new(T0);
    let r = Retention { history_retention: Duration::ZERO, ..staggered() };
    let p = service(store.clone(), &clock, MockChannel::reliable(), r);
    p.create_order(T, &order_no("O-1"), 1000, &cny()).await.unwrap();
    let token = p.issue_token(T).await.unwrap().token;
    let first = p.pay(T, &token, ROUTE, &request("O-1"), WAIT).await.unwrap();
    assert_eq!(first.status, 201, "{}", first.body);
    let steps = u64::try_from(store.steps(&payment_workflow_id(&token)).await.unwrap().len()).unwrap();
    pass_at(&p, &clock, T0, report(0, 0, 1, steps), "a history kept 0 s").await;
    let replay = p.pay(T, &token, ROUTE, &request("O-1"), WAIT).await.unwrap();
    assert_eq!((replay.status, &replay.body, replay.replayed), (201, &first.body, true));
    assert!(store.workflow(&payment_workflow_id(&token)).await.unwrap().is_none(), "the replay recorded nothing");
    let other = p.pay(T, &token, ROUTE, &pay_request("O-1", 999, None), WAIT).await.unwrap();
    assert_eq!((other.status, code(&other.body)), (422, "idempotency_key_mismatch".to_owned()));
}

/// More than two batches of each kind.
const MANY: usize = 1_100;

async fn two_passes_at_once_delete_each_row_once<S: TestDb + PaymentStore>(store: S) {
    let clock = ManualClock::new(T0);
    let r = Retention {
        token_ttl: Duration::from_millis(5),
        response_retention: Duration::from_millis(5),
        history_retention: Duration::from_millis(5),
    };
    let p = service(store.clone(), &clock, MockChannel::reliable(), r);
    let next = Arc::new(AtomicUsize::new(0));
    let mut fill = Vec::new();
    for _ in 0..16 {
        let (p, next) = (p.clone(), next.clone());
        fill.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= MANY {
                    return;
                }
                let order = format!("O-{i}");
                p.create_order(T, &order_no(&order), 1000, &cny()).await.unwrap();
                p.issue_token(T).await.unwrap();
                let token = p.issue_token(T).await.unwrap().token;
                assert_eq!(p.pay(T, &token, ROUTE, &request(&order), WAIT).await.unwrap().status, 201);
            }
        }));
    }
    for f in fill {
        f.await.unwrap();
    }
    clock.advance(10);
    let many = MANY as u64;
    let expected = report(many, many, many, many * STEPS);
    assert_eq!(p.retention_pass(true).await.unwrap().unwrap(), PassReport { dry_run: true, ..expected });

    // Two processes' passes at once, and payments meanwhile (their rows are younger than the retention).
    let other = service(store.another_pool().await.unwrap(), &clock, MockChannel::reliable(), r);
    let running = Arc::new(AtomicBool::new(true));
    let paid_meanwhile = Arc::new(AtomicUsize::new(0));
    let payer = {
        let (p, running, paid_meanwhile) = (p.clone(), running.clone(), paid_meanwhile.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while running.load(Ordering::SeqCst) {
                let order = format!("N-{i}");
                i += 1;
                p.create_order(T, &order_no(&order), 1000, &cny()).await.unwrap();
                let token = p.issue_token(T).await.unwrap().token;
                let paid = p.pay(T, &token, ROUTE, &request(&order), WAIT).await.unwrap();
                assert_eq!(paid.status, 201, "{}", paid.body);
                if running.load(Ordering::SeqCst) {
                    paid_meanwhile.fetch_add(1, Ordering::SeqCst);
                }
            }
            i
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (a, b) = tokio::join!(p.retention_pass(false), other.retention_pass(false));
    running.store(false, Ordering::SeqCst);
    let paid = payer.await.unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.is_some() || b.is_some(), "one of them ran");
    let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
    let sum = report(
        a.unused_tokens + b.unused_tokens,
        a.used_tokens + b.used_tokens,
        a.workflows + b.workflows,
        a.steps + b.steps,
    );
    assert_eq!(sum, expected, "every row deleted once: {a:?} and {b:?}");
    assert!(paid_meanwhile.load(Ordering::SeqCst) >= 2, "payments went on during the passes ({paid} paid)");
    // What was paid meanwhile is younger than the retention: the next pass at this time leaves it.
    assert_eq!(p.retention_pass(false).await.unwrap().unwrap(), report(0, 0, 0, 0));
    clock.advance(10);
    let later = p.retention_pass(false).await.unwrap().unwrap();
    assert_eq!((later.used_tokens, later.workflows), (paid as u64, paid as u64), "{later:?}");
}

async fn one_pass_at_a_time<S: TestDb + PaymentStore>(store: S) {
    let clock = ManualClock::new(T0);
    let p = service(store.clone(), &clock, MockChannel::reliable(), staggered());
    let other = service(store.another_pool().await.unwrap(), &clock, MockChannel::reliable(), staggered());
    let alone = store.backend() == "sqlite";
    let lock = store.lock_pass().await.unwrap().expect("nobody holds the lock");
    let skipped = other.retention_pass(false).await.unwrap();
    assert_eq!(skipped.is_some(), alone, "another process holds the lock (SQLite: one process, no lock)");
    lock.release().await.unwrap();
    assert!(other.retention_pass(false).await.unwrap().is_some(), "released");
    // A lock dropped unreleased (a pass that panicked or was cancelled) goes with its closed session.
    drop(other.engine().store().lock_pass().await.unwrap().expect("free again"));
    let mut freed = false;
    for _ in 0..50 {
        if p.retention_pass(false).await.unwrap().is_some() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the dropped lock's session was closed");
}

fn steps_engine<S: TestDb>(store: S, clock: &ManualClock, hooks: &Arc<Hooks>) -> Engine<S> {
    Engine::builder(store).register(Steps { hooks: hooks.clone() }).clock(clock.clone()).build()
}

fn input(label: &str, fail: bool) -> StepsInput {
    StepsInput { label: label.to_owned(), fail }
}

/// Completed, failed and cancelled histories go; a `compensation_failed` one waits for its operator, and goes
/// only once a retry has ended it; a running one stays.
async fn finished_histories_go_and_one_waiting_for_an_operator_stays<S: TestDb>(store: S) {
    let clock = ManualClock::new(T0);
    let (hooks, stuck_hooks) = (Arc::new(Hooks::default()), Arc::new(Hooks::default()));
    let engine = steps_engine(store.clone(), &clock, &hooks);
    let ended = |id: &'static str, fail| {
        let engine = engine.clone();
        async move { engine.start::<Steps>(id, &input(id, fail)).await.unwrap().wait(WAIT).await.unwrap().unwrap() }
    };
    assert!(matches!(ended("done", false).await, Outcome::Completed(_)));
    assert!(matches!(ended("failed", true).await, Outcome::Failed(_)));
    stuck_hooks.fail_compensations.store(true, Ordering::SeqCst);
    let stuck = steps_engine(store.clone(), &clock, &stuck_hooks);
    let outcome = stuck.start::<Steps>("stuck", &input("stuck", true)).await.unwrap().wait(WAIT).await.unwrap();
    assert!(matches!(outcome, Some(Outcome::CompensationFailed(_))), "{outcome:?}");
    // Two runs held at `e2`: one stays running, the other an operator cancels.
    let mut held = Vec::new();
    for id in ["running", "cancelled"] {
        let runner_hooks = Arc::new(Hooks::default());
        let mut reached = runner_hooks.stop_at("e2").await;
        let runner = steps_engine(store.another_pool().await.unwrap(), &clock, &runner_hooks);
        held.push((runner.start::<Steps>(id, &input(id, false)).await.unwrap(), runner_hooks));
        reached.recv().await.unwrap();
    }
    engine.cancel("cancelled").await.unwrap();
    assert_eq!(engine.recover_once().await.unwrap(), 1);
    assert!(matches!(engine.wait("cancelled", WAIT).await.unwrap(), Some(Outcome::Cancelled(_))));

    let now = clock.now_ms();
    assert_eq!(engine.count_finished_before(now - 1).await.unwrap().workflows, 0, "none ended before now");
    let due = engine.count_finished_before(now).await.unwrap();
    assert_eq!(due.workflows, 3, "{due:?}");
    assert_eq!(engine.delete_finished_before(now, 2).await.unwrap().workflows, 2, "a batch holds its limit");
    let rest = engine.delete_finished_before(now, 2).await.unwrap();
    assert_eq!(rest.workflows, 1);
    assert_eq!(engine.delete_finished_before(now, 2).await.unwrap().workflows, 0);
    for id in ["done", "failed", "cancelled"] {
        assert!(store.workflow(id).await.unwrap().is_none(), "{id}");
        assert!(store.steps(id).await.unwrap().is_empty(), "{id}: its steps");
    }
    clock.advance(400 * 24 * HOUR);
    let later = clock.now_ms();
    assert_eq!(engine.delete_finished_before(later, 500).await.unwrap().workflows, 0);
    assert_eq!(store.workflow("stuck").await.unwrap().unwrap().state, WorkflowState::CompensationFailed);
    assert!(!store.steps("stuck").await.unwrap().is_empty());
    assert_eq!(store.workflow("running").await.unwrap().unwrap().state, WorkflowState::Running);
    // The operator retries: the compensations finish, and the history is finished, hence due. (The held run's
    // lease has long expired meanwhile: the same recovery resumes it, and it completes.)
    engine.retry("stuck").await.unwrap();
    assert_eq!(engine.recover_once().await.unwrap(), 2);
    assert!(matches!(engine.wait("stuck", WAIT).await.unwrap(), Some(Outcome::Failed(_))));
    assert!(matches!(engine.wait("running", WAIT).await.unwrap(), Some(Outcome::Completed(_))));
    assert_eq!(engine.delete_finished_before(clock.now_ms(), 500).await.unwrap().workflows, 2);
    for (_, hooks) in &held {
        hooks.resume.notify_one();
    }
}

/// A payment stopped by a step mismatch (a deploy changed a step under it while its charge was in flight) ends
/// `failed` with nothing compensated: its order is still `paying` and its charge unresolved. It waits for an
/// operator as a `compensation_failed` one does: no pass deletes it, however late, and once the right code is
/// back the operator's retry finishes the payment, one charge at the channel.
async fn a_payment_stopped_by_a_step_mismatch_waits_for_its_operator<S: TestDb + PaymentStore>(store: S) {
    let clock = ManualClock::new(T0);
    let r = Retention { history_retention: Duration::ZERO, ..staggered() };
    let channel = MockChannel::reliable();
    let p = service(store.clone(), &clock, channel.clone(), r);
    let held = channel.with_config(MockChannelConfig { hold_ms: 1_500, ..MockChannelConfig::default() });
    let stalled = service(store.another_pool().await.unwrap(), &clock, held, r);
    p.create_order(T, &order_no("O-1"), 1000, &cny()).await.unwrap();
    let token = stalled.issue_token(T).await.unwrap().token;
    let processing = stalled.pay(T, &token, ROUTE, &request("O-1"), Duration::from_millis(300)).await.unwrap();
    assert_eq!(processing.status, 202, "{}", processing.body);
    let workflow = payment_workflow_id(&token);
    // The lease lapses while the charge is held; the step's history no longer matches what the code runs.
    clock.advance(EngineConfig::default().lease.as_millis() as i64 + 1);
    let call = "UPDATE workflow_steps SET kind = 'transactional' WHERE step_key = 'call_channel' AND workflow_id = $1";
    assert_eq!(store.execute(call, &workflow).await.unwrap(), 1);
    assert_eq!(p.engine().recover_once().await.unwrap(), 1);
    let outcome = p.engine().wait(&workflow, WAIT).await.unwrap();
    let Some(Outcome::Failed(failure)) = outcome else { panic!("got {outcome:?}") };
    assert_eq!(failure.code, "step_mismatch");
    assert_eq!(p.order(T, &order_no("O-1")).await.unwrap().unwrap().status, OrderStatus::Paying);

    pass_at(&p, &clock, T0 + 400 * 24 * HOUR, report(0, 0, 0, 0), "a year on").await;
    assert_eq!(store.workflow(&workflow).await.unwrap().unwrap().state, WorkflowState::Failed, "kept for its operator");
    assert!(!store.steps(&workflow).await.unwrap().is_empty(), "with its steps");
    // Once the held charge has landed and the right code is back, the operator's retry finishes the payment.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let call = "UPDATE workflow_steps SET kind = 'external' WHERE step_key = 'call_channel' AND workflow_id = $1";
    assert_eq!(store.execute(call, &workflow).await.unwrap(), 1);
    assert_eq!(p.engine().retry(&workflow).await.unwrap().state, WorkflowState::Running);
    assert_eq!(p.engine().recover_once().await.unwrap(), 1);
    assert!(matches!(p.engine().wait(&workflow, WAIT).await.unwrap(), Some(Outcome::Completed(_))));
    assert_eq!(p.order(T, &order_no("O-1")).await.unwrap().unwrap().status, OrderStatus::Paid);
    assert_eq!(channel.ledger().kept_charges("O-1"), 1);
    assert!(check_invariants(&store, &channel.ledger()).await.unwrap().is_empty());
    // Finished now: the next pass takes its history.
    assert_eq!(p.retention_pass(false).await.unwrap().unwrap().workflows, 1);
}

/// A storm of repeats after the response retention, while the history is still kept: every one is
/// `404 token_not_found`. The first starts a run that the deleted token refuses; the others join that run in
/// this process before it stops, and must not take the kept workflow's old answer for theirs.
async fn a_storm_of_replays_after_the_response_retention_is_not_found<S: TestDb + PaymentStore>(store: S) {
    let clock = ManualClock::new(T0);
    let p = service(store.clone(), &clock, MockChannel::reliable(), staggered());
    p.create_order(T, &order_no("O-1"), 1000, &cny()).await.unwrap();
    let token = p.issue_token(T).await.unwrap().token;
    let first = p.pay(T, &token, ROUTE, &request("O-1"), WAIT).await.unwrap();
    assert_eq!(first.status, 201, "{}", first.body);
    pass_at(&p, &clock, T0 + 2 * HOUR, report(0, 1, 0, 0), "the response retention").await;
    assert!(store.workflow(&payment_workflow_id(&token)).await.unwrap().is_some(), "the history is kept");
    let req = request("O-1");
    let storm = (0..100).map(|_| p.pay(T, &token, ROUTE, &req, WAIT));
    for r in futures_util::future::join_all(storm).await {
        let r = r.unwrap();
        assert_eq!((r.status, code(&r.body)), (404, "token_not_found".to_owned()), "{}", r.body);
    }
}

on_every_backend!(
    a_payment_stopped_by_a_step_mismatch_waits_for_its_operator,
    finished_histories_go_and_one_waiting_for_an_operator_stays,
    one_pass_at_a_time,
    each_kind_goes_exactly_when_its_retention_has_passed,
    a_replay_outlives_the_history,
    a_storm_of_replays_after_the_response_retention_is_not_found,
    two_passes_at_once_delete_each_row_once,
);
