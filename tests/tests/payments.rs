//! The payment saga on SQLite, Postgres and MySQL: duplicate storms, one order under many tokens, mismatches, every
//! channel fault, declines; the invariant checker after each.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::EngineConfig;
use onceflow_payments::{
    Channel, HttpChannel, MockChannel, MockChannelConfig, OrderStatus, PayResponse, PaymentRequest, PaymentStatus,
    PaymentStore, Payments, check_invariants, mock_channel_router,
};
use onceflow_tests::ids::{cny, order_no, pay_request, request_no};
use onceflow_tests::{TestDb, on_every_backend};

const T: &str = "default";
const ROUTE: &str = "/v1/payments";
const WAIT: Duration = Duration::from_secs(20);

fn payments<S: PaymentStore>(store: S, channel: Arc<dyn Channel>) -> Payments<S> {
    Payments::new(store, channel, EngineConfig::default())
}

fn request(order: &str, amount: i64) -> PaymentRequest {
    pay_request(order, amount, None)
}

async fn assert_invariants<S: PaymentStore>(store: &S, channel: &MockChannel) {
    let violations = check_invariants(store, &channel.ledger()).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap()
}

async fn two_hundred_requests_one_token_one_charge<S: TestDb + PaymentStore>(store: S) {
    let channel = MockChannel::new(MockChannelConfig { latency_ms: 20, ..MockChannelConfig::default() });
    let p = payments(store.clone(), Arc::new(channel.clone()));
    p.create_order(T, &order_no("O-1"), 1000, &cny()).await.unwrap();
    let token = p.issue_token(T).await.unwrap().token;
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (p, token) = (p.clone(), token.clone());
        tasks.push(tokio::spawn(async move { p.pay(T, &token, ROUTE, &request("O-1", 1000), WAIT).await }));
    }
    let mut responses: Vec<PayResponse> = Vec::new();
    for t in tasks {
        responses.push(t.await.unwrap().unwrap());
    }
    let first = &responses[0];
    assert_eq!(first.status, 201, "{}", first.body);
    assert!(responses.iter().all(|r| r.status == first.status && r.body == first.body), "identical responses");
    assert_eq!(responses.iter().filter(|r| !r.replayed).count(), 1, "one original, the rest replays");
    assert_eq!(channel.ledger().kept_charges("O-1"), 1);
    assert_eq!(channel.ledger().charges.len(), 1);
    assert_eq!(p.order(T, &order_no("O-1")).await.unwrap().unwrap().status, OrderStatus::Paid);
    let body = json(&first.body);
    assert_eq!(body["status"], "succeeded");
    let record = p.payment(T, &request_no(body["request_no"].as_str().unwrap())).await.unwrap().unwrap();
    assert_eq!(record.status, PaymentStatus::Succeeded);
    // A later repeat is a replay of the same bytes.
    let again = p.pay(T, &token, ROUTE, &request("O-1", 1000), WAIT).await.unwrap();
    assert_eq!((again.status, &again.body, again.replayed), (201, &first.body, true));
    assert_invariants(&store, &channel).await;
}

async fn fifty_tokens_one_order_one_charge<S: TestDb + PaymentStore>(store: S) {
    let channel = MockChannel::new(MockChannelConfig { latency_ms: 20, ..MockChannelConfig::default() });
    let p = payments(store.clone(), Arc::new(channel.clone()));
    p.create_order(T, &order_no("O-2"), 500, &cny()).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let p = p.clone();
        let token = p.issue_token(T).await.unwrap().token;
        tasks.push(tokio::spawn(async move { p.pay(T, &token, ROUTE, &request("O-2", 500), WAIT).await }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        if r.status == 409 {
            assert_eq!(json(&r.body)["code"], "order_not_payable");
        }
        statuses.push(r.status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 49, "{statuses:?}");
    assert_eq!(channel.ledger().charges.len(), 1);
    assert_invariants(&store, &channel).await;
}

async fn a_token_is_bound_to_its_request<S: TestDb + PaymentStore>(store: S) {
    let channel = MockChannel::reliable();
    let p = payments(store.clone(), Arc::new(channel.clone()));
    p.create_order(T, &order_no("O-3"), 1000, &cny()).await.unwrap();
    p.create_order(T, &order_no("O-4"), 1000, &cny()).await.unwrap();
    let token = p.issue_token(T).await.unwrap().token;
    assert_eq!(p.pay(T, &token, ROUTE, &request("O-3", 1000), WAIT).await.unwrap().status, 201);
    for (route, req) in [(ROUTE, request("O-3", 999)), (ROUTE, request("O-4", 1000)), ("/pay", request("O-3", 1000))] {
        let r = p.pay(T, &token, route, &req, WAIT).await.unwrap();
        assert_eq!((r.status, json(&r.body)["code"].as_str()), (422, Some("idempotency_key_mismatch")));
    }
    // A fresh token with another amount than the order's: stored 422, nothing charged.
    let other = p.issue_token(T).await.unwrap().token;
    assert_eq!(p.pay(T, &other, ROUTE, &request("O-4", 999), WAIT).await.unwrap().status, 422);
    let replay = p.pay(T, &other, ROUTE, &request("O-4", 999), WAIT).await.unwrap();
    assert_eq!(
        (replay.status, json(&replay.body)["code"].as_str(), replay.replayed),
        (422, Some("amount_mismatch"), true)
    );
    // An expired token is unknown.
    let expired = p.issue_token(T).await.unwrap().token;
    let updated =
        store.execute("UPDATE idempotency_tokens SET expires_at = 1 WHERE token = $1", expired.as_str()).await;
    assert_eq!(updated.unwrap(), 1);
    let r = p.pay(T, &expired, ROUTE, &request("O-4", 1000), WAIT).await.unwrap();
    assert_eq!((r.status, json(&r.body)["code"].as_str()), (404, Some("token_not_found")));
    // Unknown token, another tenant's token, unknown order (not stored: the token stays usable).
    assert_eq!(
        p.pay(T, &onceflow_tests::ids::token("tok_nope"), ROUTE, &request("O-4", 1000), WAIT).await.unwrap().status,
        404
    );
    let theirs = p.issue_token("other-tenant").await.unwrap().token;
    assert_eq!(p.pay(T, &theirs, ROUTE, &request("O-4", 1000), WAIT).await.unwrap().status, 404);
    let fresh = p.issue_token(T).await.unwrap().token;
    let missing = p.pay(T, &fresh, ROUTE, &request("O-404", 1000), WAIT).await.unwrap();
    assert_eq!((missing.status, json(&missing.body)["code"].as_str()), (404, Some("order_not_found")));
    // An invalid request cannot be made, so never reaches the service.
    assert!(PaymentRequest::new(order_no("O-4"), -5, cny(), None).is_err());
    assert_eq!(p.pay(T, &fresh, ROUTE, &request("O-4", 1000), WAIT).await.unwrap().status, 201);
    // request_no is unique forever.
    p.create_order(T, &order_no("O-5"), 1000, &cny()).await.unwrap();
    let taken = json(&p.pay(T, &token, ROUTE, &request("O-3", 1000), WAIT).await.unwrap().body)["request_no"]
        .as_str()
        .unwrap()
        .to_owned();
    let reuse = pay_request("O-5", 1000, Some(&taken));
    let t5 = p.issue_token(T).await.unwrap().token;
    let conflict = p.pay(T, &t5, ROUTE, &reuse, WAIT).await.unwrap();
    assert_eq!((conflict.status, json(&conflict.body)["code"].as_str()), (409, Some("request_no_conflict")));
    assert_eq!(channel.ledger().charges.len(), 2);
    assert_invariants(&store, &channel).await;
}

async fn pay_once_through<S: TestDb + PaymentStore>(
    store: &S,
    channel: Arc<dyn Channel>,
    order_no: &str,
) -> PayResponse {
    let p = payments(store.clone(), channel);
    p.create_order(T, &self::order_no(order_no), 1000, &cny()).await.unwrap();
    let token = p.issue_token(T).await.unwrap().token;
    p.pay(T, &token, ROUTE, &request(order_no, 1000), WAIT).await.unwrap()
}

async fn every_channel_fault_ends_in_one_charge<S: TestDb + PaymentStore>(store: S) {
    let faults = [
        ("error-after", MockChannelConfig { error_after_rate: 1.0, ..Default::default() }),
        ("error-before", MockChannelConfig { error_before_rate: 0.6, seed: 7, ..Default::default() }),
        ("processing", MockChannelConfig { processing_rate: 1.0, settle_ms: 300, ..Default::default() }),
        ("slow", MockChannelConfig { slow_rate: 1.0, ..Default::default() }),
    ];
    let ledger_keeper = MockChannel::reliable();
    for (name, config) in faults {
        // One ledger across the faults, so the invariants see every order.
        let channel = ledger_keeper.with_config(config);
        let r = pay_once_through(&store, Arc::new(channel.clone()), name).await;
        assert_eq!(r.status, 201, "{name}: {}", r.body);
        let ledger = channel.ledger();
        let charges = ledger.charges.iter().filter(|c| c.order_no == name).count();
        assert_eq!((charges, ledger.kept_charges(name)), (1, 1), "{name}: {ledger:?}");
        assert_invariants(&store, &channel).await;
    }
}

/// A real timeout: the channel charges, then answers after the client gave up.
async fn a_channel_that_times_out_after_charging<S: TestDb + PaymentStore>(store: S) {
    let mock = MockChannel::new(MockChannelConfig { slow_rate: 1.0, slow_ms: 1_000, ..Default::default() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, mock_channel_router(mock.clone())).into_future());
    let client = HttpChannel::new(&base, Duration::from_millis(200)).unwrap();
    let r = pay_once_through(&store, Arc::new(client), "timeout").await;
    assert_eq!(r.status, 201, "{}", r.body);
    let ledger = mock.ledger();
    assert_eq!(ledger.charges.len(), 1);
    assert!(ledger.query_calls >= 1, "the unknown outcome was resolved by a query");
    assert_invariants(&store, &mock).await;
}

async fn a_decline_releases_the_order_and_is_replayed<S: TestDb + PaymentStore>(store: S) {
    let declining = MockChannel::new(MockChannelConfig { decline_rate: 1.0, ..Default::default() });
    let p = payments(store.clone(), Arc::new(declining.clone()));
    p.create_order(T, &order_no("O-6"), 1000, &cny()).await.unwrap();
    let token = p.issue_token(T).await.unwrap().token;
    let r = p.pay(T, &token, ROUTE, &request("O-6", 1000), WAIT).await.unwrap();
    assert_eq!(r.status, 402, "{}", r.body);
    let body = json(&r.body);
    assert_eq!(
        (body["code"].as_str(), body["decline_code"].as_str()),
        (Some("payment_declined"), Some("insufficient_funds"))
    );
    let order = p.order(T, &order_no("O-6")).await.unwrap().unwrap();
    assert_eq!((order.status, order.version), (OrderStatus::Pending, 2));
    let replay = p.pay(T, &token, ROUTE, &request("O-6", 1000), WAIT).await.unwrap();
    assert_eq!((replay.status, &replay.body, replay.replayed), (402, &r.body, true));
    assert_invariants(&store, &declining).await;
    // A new token can pay the order now.
    let reliable = MockChannel::reliable();
    let p2 = payments(store.clone(), Arc::new(reliable.clone()));
    let fresh = p2.issue_token(T).await.unwrap().token;
    assert_eq!(p2.pay(T, &fresh, ROUTE, &request("O-6", 1000), WAIT).await.unwrap().status, 201);
    assert_eq!(reliable.ledger().kept_charges("O-6"), 1);
    assert_eq!(declining.ledger().kept_charges("O-6"), 0);
}

/// Storms under a used token of requests it was not used for: every one is refused, none is answered with the
/// payment the token paid. The first of each storm starts a run that the token refuses; the others join that
/// run in this process before it stops, so they must still be held to the workflow the token recorded.
async fn a_storm_of_other_requests_under_a_used_token_is_refused<S: TestDb + PaymentStore>(store: S) {
    let channel = MockChannel::reliable();
    let p = payments(store.clone(), Arc::new(channel.clone()));
    p.create_order(T, &order_no("O-7"), 1000, &cny()).await.unwrap();
    let token = p.issue_token(T).await.unwrap().token;
    let paid = p.pay(T, &token, ROUTE, &request("O-7", 1000), WAIT).await.unwrap();
    assert_eq!(paid.status, 201, "{}", paid.body);
    let storm = |tenant: &'static str, amount: i64| {
        let (p, token) = (&p, &token);
        futures_util::future::join_all(
            (0..100).map(move |_| async move { p.pay(tenant, token, ROUTE, &request("O-7", amount), WAIT).await }),
        )
    };
    for r in storm(T, 999).await {
        let r = r.unwrap();
        assert_eq!((r.status, json(&r.body)["code"].as_str()), (422, Some("idempotency_key_mismatch")), "{}", r.body);
    }
    // Another tenant presenting the token: it is not theirs, and the payment it made is not shown to them.
    for r in storm("other-tenant", 1000).await {
        let r = r.unwrap();
        assert_eq!((r.status, json(&r.body)["code"].as_str()), (404, Some("token_not_found")), "{}", r.body);
    }
    assert_eq!(channel.ledger().charges.len(), 1);
    assert_invariants(&store, &channel).await;
}

on_every_backend!(
    two_hundred_requests_one_token_one_charge,
    fifty_tokens_one_order_one_charge,
    a_token_is_bound_to_its_request,
    every_channel_fault_ends_in_one_charge,
    a_channel_that_times_out_after_charging,
    a_decline_releases_the_order_and_is_replayed,
    a_storm_of_other_requests_under_a_used_token_is_refused,
);
