//! Refunds through the service as a library, on every backend, with the mock channel's ledger as the judge:
//! the retention pass takes a refund's token, answer and history when their time has come and never a refund
//! in flight; an operator's cancel of a refund the channel holds ends it as the channel says (refunded after all,
//! or failed and released); the invariant checker catches refunds that are not as the records say.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::clock::ManualClock;
use onceflow_engine::store::WorkflowState;
use onceflow_engine::{EngineConfig, Outcome};
use onceflow_payments::{
    Channel, MockChannel, MockChannelConfig, NewRefund, OrderStatus, PassReport, PaymentStore, Payments, RefundNo,
    RefundRequest, RefundState, Retention, TokenState, check_invariants, refund_workflow_id,
};
use onceflow_tests::ids::{cny, order_no, pay_request, request_no};
use onceflow_tests::{TestDb, on_every_backend};

const T: &str = "default";
const WAIT: Duration = Duration::from_secs(20);
const T0: i64 = 1_700_000_000_000;
const HOUR: i64 = 3_600_000;

fn refund(amount: i64, no: &str) -> NewRefund {
    NewRefund::new(amount, Some(RefundNo::parse(no).unwrap()), None).unwrap()
}

fn code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap()["code"].as_str().unwrap_or_default().to_owned()
}

/// Pays order `order` (1000 CNY) as `request`.
async fn paid<S: PaymentStore>(p: &Payments<S>, order: &str, request: &str) {
    p.create_order(T, &order_no(order), 1000, &cny()).await.unwrap();
    let token = p.issue_token(T).await.unwrap().token;
    let paid = p.pay(T, &token, "/v1/payments", &pay_request(order, 1000, Some(request)), WAIT).await.unwrap();
    assert_eq!(paid.status, 201, "{}", paid.body);
}

fn report(unused_tokens: u64, used_tokens: u64, workflows: u64, steps: u64) -> PassReport {
    PassReport { unused_tokens, used_tokens, workflows, steps, events: 0, dry_run: false }
}

/// A refund's token and answer go when the response retention has passed, its history when the history
/// retention has; the refund itself is kept. A refund held in flight at the channel keeps its token, workflow
/// and reservation through a year of passes.
async fn refund_rows_go_with_their_retention<S: TestDb + PaymentStore>(store: S) {
    let clock = ManualClock::new(T0);
    let retention = Retention {
        token_ttl: Duration::from_secs(3600),
        response_retention: Duration::from_secs(2 * 3600),
        history_retention: Duration::from_secs(3 * 3600),
    };
    let channel = MockChannel::reliable();
    let service = |store: S, channel: MockChannel| {
        Payments::with_clock(store, Arc::new(channel), EngineConfig::default(), clock.clone()).with_retention(retention)
    };
    let p = service(store.clone(), channel.clone());
    let held =
        service(store.clone(), channel.with_config(MockChannelConfig { latency_ms: 3_600_000, ..Default::default() }));
    paid(&p, "O-1", "R-1").await;
    let token = p.issue_token(T).await.unwrap().token;
    let first = p.refund(T, &token, &request_no("R-1"), &refund(300, "RF-1"), WAIT).await.unwrap();
    assert_eq!(first.status, 201, "{}", first.body);
    let in_flight = held.issue_token(T).await.unwrap().token;
    let (r1, rf2) = (request_no("R-1"), refund(200, "RF-2"));
    let pending = held.refund(T, &in_flight, &r1, &rf2, Duration::from_millis(300)).await.unwrap();
    assert_eq!(pending.status, 202, "{}", pending.body);
    let payment_steps = 5;
    let refund_steps = u64::try_from(store.steps(&refund_workflow_id(&token)).await.unwrap().len()).unwrap();
    assert_eq!(refund_steps, 5, "claim_token, insert_refund, reserve_amount, call_refund, confirm_refund");

    clock.advance(2 * HOUR - 1);
    assert_eq!(p.retention_pass(false).await.unwrap().unwrap(), report(0, 0, 0, 0));
    let replay = p.refund(T, &token, &request_no("R-1"), &refund(300, "RF-1"), WAIT).await.unwrap();
    assert_eq!((replay.status, &replay.body, replay.replayed), (201, &first.body, true));
    clock.advance(1);
    // The payment's token and the refund's.
    assert_eq!(p.retention_pass(false).await.unwrap().unwrap(), report(0, 2, 0, 0));
    let gone = p.refund(T, &token, &request_no("R-1"), &refund(300, "RF-1"), WAIT).await.unwrap();
    assert_eq!((gone.status, code(&gone.body)), (404, "token_not_found".to_owned()), "{}", gone.body);
    clock.advance(HOUR);
    assert_eq!(p.retention_pass(false).await.unwrap().unwrap(), report(0, 0, 2, payment_steps + refund_steps));
    assert!(store.workflow(&refund_workflow_id(&token)).await.unwrap().is_none());

    clock.advance(400 * 24 * HOUR);
    assert_eq!(p.retention_pass(false).await.unwrap().unwrap(), report(0, 0, 0, 0), "a year on");
    let kept = p.refund_record(T, &RefundNo::parse("RF-1").unwrap()).await.unwrap().unwrap();
    assert_eq!(kept.status, RefundState::Succeeded, "refunds are kept");
    let (t, _) = store.token_and_payment(&in_flight, T, &request_no("R-1")).await.unwrap().unwrap();
    assert_eq!(t.state, TokenState::InUse);
    let running = store.workflow(&refund_workflow_id(&in_flight)).await.unwrap().unwrap();
    assert_eq!(running.state, WorkflowState::Running);
    let payment = p.payment(T, &request_no("R-1")).await.unwrap().unwrap();
    assert_eq!((payment.refunded_amount, payment.refund_reserved), (300, 200));
}

/// The channel answers a refund `processing`; an operator cancels its workflow meanwhile. The cancel's
/// compensation asks again with the same request (refunds have no close) until the channel says: refunded, the
/// refund is confirmed (never released: the money went back) and its token answers `201`; failed, its
/// reservation is released and its token answers `422 refund_failed`. Either way the workflow ends
/// `cancelled`, and a second refund's reservation is left alone.
async fn a_cancelled_refund_ends_as_the_channel_says<S: TestDb + PaymentStore>(store: S) {
    let ledger = MockChannel::reliable();
    let config = EngineConfig { poll_interval: Duration::from_millis(50), ..EngineConfig::default() };
    let p = Payments::new(store.clone(), Arc::new(ledger.clone()), config.clone());
    let _background = p.engine().spawn_background();
    paid(&p, "O-1", "R-1").await;
    // Another refund, in flight at the channel throughout (held).
    let held = ledger.with_config(MockChannelConfig { latency_ms: 60_000, ..Default::default() });
    let other = Payments::new(store.another_pool().await.unwrap(), Arc::new(held), config.clone());
    let other_token = other.issue_token(T).await.unwrap().token;
    let (r1, held_refund) = (request_no("R-1"), refund(100, "RF-held"));
    let other_refund = other.refund(T, &other_token, &r1, &held_refund, Duration::ZERO).await.unwrap();
    assert_eq!(other_refund.status, 202, "{}", other_refund.body);

    for (outcome, fail_rate) in [("succeeded", 0.0), ("failed", 1.0)] {
        let slow = ledger.with_config(MockChannelConfig {
            refund_processing_rate: 1.0,
            refund_fail_rate: fail_rate,
            settle_ms: 1_500,
            ..Default::default()
        });
        let s = Payments::new(store.another_pool().await.unwrap(), Arc::new(slow), config.clone());
        let _runs = s.engine().spawn_background();
        let token = s.issue_token(T).await.unwrap().token;
        let no = format!("RF-{outcome}");
        let asked = s.refund(T, &token, &r1, &refund(400, &no), Duration::from_millis(300)).await.unwrap();
        assert_eq!(asked.status, 202, "{outcome}: processing: {}", asked.body);
        let workflow = refund_workflow_id(&token);
        p.engine().cancel(&workflow).await.unwrap();
        let ended = p.engine().wait(&workflow, WAIT).await.unwrap();
        assert!(matches!(ended, Some(Outcome::Cancelled(_))), "{outcome}: {ended:?}");
        let record = p.refund_record(T, &RefundNo::parse(no.as_str()).unwrap()).await.unwrap().unwrap();
        let answer = s.refund(T, &token, &request_no("R-1"), &refund(400, &no), WAIT).await.unwrap();
        if outcome == "succeeded" {
            assert_eq!(record.status, RefundState::Succeeded);
            assert_eq!(answer.status, 201, "the answer is what happened: {}", answer.body);
        } else {
            assert_eq!(record.status, RefundState::Failed);
            assert_eq!((answer.status, code(&answer.body)), (422, "refund_failed".to_owned()), "{}", answer.body);
        }
        let channel_says =
            ledger.ledger().refunds.iter().find(|r| r.merchant_refund_no == record.merchant_refund_no).cloned();
        assert_eq!(channel_says.map(|r| r.status).map(|s| format!("{s:?}").to_lowercase()), Some(outcome.to_owned()));
    }
    let payment = p.payment(T, &request_no("R-1")).await.unwrap().unwrap();
    assert_eq!((payment.refunded_amount, payment.refund_reserved), (400, 100), "the held refund's reservation stays");
    assert_eq!(p.order(T, &order_no("O-1")).await.unwrap().unwrap().status, OrderStatus::Paid);
}

/// The checker is a judge that can fail: a refund at the channel that no record holds, a payment whose
/// `refunded_amount` disagrees with the channel, an order left `paid` after its charge came back whole.
async fn the_invariants_catch_refunds_that_are_not_as_recorded<S: TestDb + PaymentStore>(store: S) {
    let ledger = MockChannel::reliable();
    let p = Payments::new(store.clone(), Arc::new(ledger.clone()), EngineConfig::default());
    paid(&p, "O-1", "R-1").await;
    let token = p.issue_token(T).await.unwrap().token;
    assert_eq!(p.refund(T, &token, &request_no("R-1"), &refund(1000, "RF-1"), WAIT).await.unwrap().status, 201);
    assert_eq!(p.order(T, &order_no("O-1")).await.unwrap().unwrap().status, OrderStatus::Refunded);
    assert!(check_invariants(&store, &ledger.ledger()).await.unwrap().is_empty());

    // Someone else refunded a charge under a merchant refund number nobody recorded.
    paid(&p, "O-2", "R-2").await;
    let stray = RefundRequest {
        merchant_id: T.into(),
        merchant_refund_no: "rf~stray".into(),
        merchant_request_no: "R-2".into(),
        amount: 10,
        notify_url: None,
    };
    ledger.refund(&stray).await.unwrap();
    let found = check_invariants(&store, &ledger.ledger()).await.unwrap();
    let said = |what: &str| found.iter().any(|v| v.0.contains(what));
    assert!(said("has no refund record") && said("merchant refunds gave back 10"), "{found:?}");

    store.execute("UPDATE orders SET status = 'paid' WHERE order_no = $1", "O-1").await.unwrap();
    store.execute("UPDATE payments SET refunded_amount = 900 WHERE request_no = $1", "R-1").await.unwrap();
    let found = check_invariants(&store, &ledger.ledger()).await.unwrap();
    let said = |what: &str| found.iter().any(|v| v.0.contains(what));
    assert!(said("order default/O-1 is paid with 0 kept charges"), "{found:?}");
    assert!(said("order default/O-1 is paid but its charge came back whole"), "{found:?}");
    assert!(said("the payment says 900"), "{found:?}");
}

on_every_backend!(
    refund_rows_go_with_their_retention,
    a_cancelled_refund_ends_as_the_channel_says,
    the_invariants_catch_refunds_that_are_not_as_recorded,
);
