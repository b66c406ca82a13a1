//! `Payments::pay_command` (a queued command, `contracts/mq.md`) and `PaymentStore::ensure_token` on SQLite,
//! Postgres and MySQL: concurrent deliveries of one command charge once and answer alike; a command meets an
//! HTTP payment of its number as that payment; the command's token is ensured, revived when it expired unused,
//! and never touched once used.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::EngineConfig;
use onceflow_engine::clock::{Clock, ManualClock};
use onceflow_payments::{
    COMMAND_ROUTE, MockChannel, MockChannelConfig, OrderStatus, PayResponse, PaymentRequest, PaymentStore, Payments,
    Retention, StoredResponse, Token, TokenRecord, TokenState, check_invariants,
};
use onceflow_tests::ids::{cny, order_no, pay_request, request_no};
use onceflow_tests::{TestDb, on_every_backend};

const T: &str = "default";
const WAIT: Duration = Duration::from_secs(20);

fn request(order: &str, amount: i64, request_no: Option<&str>) -> PaymentRequest {
    pay_request(order, amount, request_no)
}

fn command_token(tenant: &str, number: &str) -> Token {
    Token::of_command(tenant, &request_no(number))
}

fn code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap()["code"].as_str().unwrap_or_default().to_owned()
}

/// The command token `token` unused (`issued`), made at `at`, expiring at `expires_at`.
fn unused(token: &Token, at: i64, expires_at: i64) -> TokenRecord {
    TokenRecord {
        token: token.clone(),
        tenant: T.into(),
        state: TokenState::Issued,
        fingerprint: None,
        route: None,
        response_status: None,
        response_body: None,
        created_at: at,
        expires_at,
        updated_at: at,
    }
}

async fn fifty_deliveries_of_one_command_charge_once<S: TestDb + PaymentStore>(store: S) {
    let channel = MockChannel::new(MockChannelConfig { latency_ms: 20, ..MockChannelConfig::default() });
    let p = Payments::new(store.clone(), Arc::new(channel.clone()), EngineConfig::default());
    p.create_order(T, &order_no("O-1"), 1000, &cny()).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let p = p.clone();
        tasks.push(tokio::spawn(async move { p.pay_command(T, &request("O-1", 1000, Some("R-1")), WAIT).await }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap().unwrap());
    }
    assert_eq!(answers[0].status, 201, "{}", answers[0].body);
    assert!(answers.iter().all(|a| a.status == 201 && a.body == answers[0].body), "answers differ");
    assert!(!answers[0].body.contains(command_token(T, "R-1").as_str()), "the token shows in the answer");
    assert_eq!(channel.ledger().kept_charges("O-1"), 1);
    // Later: the same bytes; other fields under the number: 422; no number or a bad field: 400.
    let again = p.pay_command(T, &request("O-1", 1000, Some("R-1")), WAIT).await.unwrap();
    assert_eq!(again.body, answers[0].body);
    let other = p.pay_command(T, &request("O-1", 999, Some("R-1")), WAIT).await.unwrap();
    assert_eq!((other.status, code(&other.body)), (422, "idempotency_key_mismatch".into()));
    let none = p.pay_command(T, &request("O-1", 1000, None), WAIT).await.unwrap();
    assert_eq!((none.status, code(&none.body)), (400, "invalid_request".into()));
    assert!(PaymentRequest::new(order_no("O-1"), 0, cny(), Some(request_no("R-2"))).is_err(), "a zero amount");
    // Another number for the paid order: refused, never charged.
    let late = p.pay_command(T, &request("O-1", 1000, Some("R-3")), WAIT).await.unwrap();
    assert_eq!((late.status, code(&late.body)), (409, "order_not_payable".into()));
    assert_eq!(channel.ledger().charges.len(), 1);
    let violations = check_invariants(&store, &channel.ledger()).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

/// Pays `order` (1000 CNY) over the HTTP route under `number` with a fresh token, as a client of `POST /v1/payments`
/// would; it must be charged.
async fn http_payment<S: PaymentStore>(p: &Payments<S>, order: &str, number: &str) -> PayResponse {
    let token = p.issue_token(T).await.unwrap().token;
    let paid = p.pay(T, &token, "/v1/payments", &request(order, 1000, Some(number)), WAIT).await.unwrap();
    assert_eq!(paid.status, 201, "{}", paid.body);
    paid
}

/// A reliable channel, the service over `store`, and order `O-1` paid over the HTTP route under `H-1`.
async fn paid_over_http<S: TestDb + PaymentStore>(store: &S) -> (MockChannel, Payments<S>, PayResponse) {
    let channel = MockChannel::reliable();
    let p = Payments::new(store.clone(), Arc::new(channel.clone()), EngineConfig::default());
    p.create_order(T, &order_no("O-1"), 1000, &cny()).await.unwrap();
    let paid = http_payment(&p, "O-1", "H-1").await;
    (channel, p, paid)
}

async fn a_command_under_an_http_number_is_that_payment<S: TestDb + PaymentStore>(store: S) {
    let (channel, p, paid) = paid_over_http(&store).await;
    for _ in 0..2 {
        let same = p.pay_command(T, &request("O-1", 1000, Some("H-1")), WAIT).await.unwrap();
        assert_eq!((same.status, &same.body), (201, &paid.body));
    }
    let other = p.pay_command(T, &request("O-1", 500, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((other.status, code(&other.body)), (422, "idempotency_key_mismatch".into()));
    assert_eq!(channel.ledger().charge_calls, 1, "a command charged again");
}

/// A command with other fields under an HTTP payment's number, taken first, binds the command's token to its
/// fields and is refused; a command with the payment's own fields is still that payment (`contracts/mq.md`).
async fn a_mismatched_command_first_leaves_the_http_payment_the_answer<S: TestDb + PaymentStore>(store: S) {
    let (channel, p, paid) = paid_over_http(&store).await;
    let other = p.pay_command(T, &request("O-1", 500, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((other.status, code(&other.body)), (422, "idempotency_key_mismatch".into()));
    for _ in 0..2 {
        let same = p.pay_command(T, &request("O-1", 1000, Some("H-1")), WAIT).await.unwrap();
        assert_eq!((same.status, &same.body), (201, &paid.body));
    }
    let again = p.pay_command(T, &request("O-1", 500, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((again.status, &again.body), (422, &other.body), "the same command, the same answer");
    assert_eq!(channel.ledger().charge_calls, 1, "a command charged again");
}

/// A number a command was answered on (an unknown order: `404`, nothing recorded), then another command under it
/// (`422`, for an order that exists), then an HTTP payment that takes the number with that command's fields: each
/// command keeps its first answer.
async fn commands_answered_before_an_http_payment_took_their_number_keep_their_answers<S: TestDb + PaymentStore>(
    store: S,
) {
    let channel = MockChannel::reliable();
    let p = Payments::new(store.clone(), Arc::new(channel.clone()), EngineConfig::default());
    p.create_order(T, &order_no("O-1"), 1000, &cny()).await.unwrap();
    let unknown = p.pay_command(T, &request("O-X", 1000, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((unknown.status, code(&unknown.body)), (404, "order_not_found".into()));
    let same = p.pay_command(T, &request("O-1", 1000, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((same.status, code(&same.body)), (422, "idempotency_key_mismatch".into()));
    let other_unknown = p.pay_command(T, &request("O-Y", 1000, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((other_unknown.status, code(&other_unknown.body)), (404, "order_not_found".into()));
    http_payment(&p, "O-1", "H-1").await;
    let other_unknown_again = p.pay_command(T, &request("O-Y", 1000, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((other_unknown_again.status, &other_unknown_again.body), (404, &other_unknown.body));
    let again = p.pay_command(T, &request("O-1", 1000, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((again.status, &again.body), (422, &same.body), "the same command, the same answer");
    let unknown_again = p.pay_command(T, &request("O-X", 1000, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((unknown_again.status, &unknown_again.body), (404, &unknown.body));
    assert_eq!(channel.ledger().charge_calls, 1);
}

/// A command for an order that does not exist under the number of an HTTP payment made before it is a command with
/// other fields than that payment's: `422` (`contracts/mq.md`), and it leaves the command's token free, so that a
/// command with the payment's own fields, coming after it, is still that payment.
async fn a_command_for_an_unknown_order_under_an_http_number_leaves_it_the_answer<S: TestDb + PaymentStore>(store: S) {
    let (channel, p, paid) = paid_over_http(&store).await;
    let unknown = p.pay_command(T, &request("O-X", 1000, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((unknown.status, code(&unknown.body)), (422, "idempotency_key_mismatch".into()));
    for _ in 0..2 {
        let same = p.pay_command(T, &request("O-1", 1000, Some("H-1")), WAIT).await.unwrap();
        assert_eq!((same.status, &same.body), (201, &paid.body));
    }
    // The order appears: the command for it is still not that payment's, and answers as before.
    p.create_order(T, &order_no("O-X"), 1000, &cny()).await.unwrap();
    let again = p.pay_command(T, &request("O-X", 1000, Some("H-1")), WAIT).await.unwrap();
    assert_eq!((again.status, &again.body), (422, &unknown.body), "the same command, the same answer");
    assert_eq!(channel.ledger().charge_calls, 1, "a command charged again");
}

/// An HTTP payment racing commands under its number — two deliveries of one for an unknown order, one with the
/// payment's fields — round after round: every delivery of a command answers as its first did, later ones too,
/// one charge a round, and the command with the payment's fields is that payment where the command for the unknown
/// order was answered as one under the payment's number.
async fn commands_racing_an_http_payment_under_its_number_keep_their_answers<S: TestDb + PaymentStore>(store: S) {
    let channel = MockChannel::reliable();
    let p = Payments::new(store.clone(), Arc::new(channel.clone()), EngineConfig::default());
    for round in 0..20 {
        let (order, number, unknown) = (format!("O-{round}"), format!("N-{round}"), format!("X-{round}"));
        p.create_order(T, &order_no(&order), 1000, &cny()).await.unwrap();
        let (u, a) = (request(&unknown, 1000, Some(&number)), request(&order, 1000, Some(&number)));
        let token = p.issue_token(T).await.unwrap().token;
        let (h, u1, u2, a1) = tokio::join!(
            p.pay(T, &token, "/v1/payments", &a, WAIT),
            p.pay_command(T, &u, WAIT),
            p.pay_command(T, &u, WAIT),
            p.pay_command(T, &a, WAIT),
        );
        let (h, u1, u2, a1) = (h.unwrap(), u1.unwrap(), u2.unwrap(), a1.unwrap());
        let (u3, a2) = (p.pay_command(T, &u, WAIT).await.unwrap(), p.pay_command(T, &a, WAIT).await.unwrap());
        for other in [&u2, &u3] {
            assert_eq!((other.status, &other.body), (u1.status, &u1.body), "round {round}: one command, two answers");
        }
        assert_eq!((a2.status, &a2.body), (a1.status, &a1.body), "round {round}: one command, two answers");
        assert!([404, 422].contains(&u1.status), "round {round}: {} {}", u1.status, u1.body);
        // The number is the HTTP payment's, or the command with its fields took it first (and paid).
        if h.status == 201 && u1.status == 422 {
            assert_eq!((a1.status, &a1.body), (201, &h.body), "round {round}: the payment's fields, its answer");
        } else if h.status == 201 {
            // The command for the unknown order was answered before the payment took the number.
            assert_eq!((a1.status, code(&a1.body)), (422, "idempotency_key_mismatch".into()), "round {round}");
        } else {
            assert_eq!((h.status, a1.status), (409, 201), "round {round}: {} {}", h.body, a1.body);
        }
    }
    assert_eq!(channel.ledger().charge_calls, 20, "two charges in a round");
    let violations = check_invariants(&store, &channel.ledger()).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

/// A command's unused token marked as under a number another payment has is never settled afterwards — not even
/// by a settle that reads no such payment (as one on a snapshot from before that payment's commit would) — and a
/// payment may still claim it.
async fn a_token_marked_under_a_taken_number_is_never_settled<S: TestDb + PaymentStore>(store: S) {
    let channel = MockChannel::reliable();
    let p = Payments::new(store.clone(), Arc::new(channel.clone()), EngineConfig::default());
    let token = command_token(T, "R-1");
    store.ensure_token(&unused(&token, 1_000, i64::MAX)).await.unwrap();
    assert!(store.mark_number_taken(&token).await.unwrap());
    let answer = StoredResponse { status: 404, body: "{}".into() };
    let settled = store.settle_unused_token(&token, &request_no("R-1"), "f", COMMAND_ROUTE, &answer, 2_000).await;
    assert!(!settled.unwrap(), "settled a marked token");
    let read = store.token_and_order(&token, T, &order_no("O-1")).await.unwrap().unwrap().0;
    assert_eq!(read.state, TokenState::Issued);
    p.create_order(T, &order_no("O-1"), 1000, &cny()).await.unwrap();
    let paid = p.pay_command(T, &request("O-1", 1000, Some("R-1")), WAIT).await.unwrap();
    assert_eq!(paid.status, 201, "{}", paid.body);
    assert!(!store.mark_number_taken(&token).await.unwrap(), "a used token is not marked");
}

async fn the_commands_token_is_ensured_revived_and_left_alone_once_used<S: TestDb + PaymentStore>(store: S) {
    let token = command_token(T, "R-9");
    let record = |expires_at: i64| unused(&token, 1_000, expires_at);
    let read = || async { store.token_and_order(&token, T, &order_no("none")).await.unwrap().unwrap().0 };
    store.ensure_token(&record(2_000)).await.unwrap();
    store.ensure_token(&record(2_000)).await.unwrap();
    assert_eq!(read().await.expires_at, 2_000);
    // Not yet expired at the second delivery: left as it is.
    store.ensure_token(&TokenRecord { created_at: 1_500, ..record(9_000) }).await.unwrap();
    assert_eq!(read().await.expires_at, 2_000);
    // Expired unused (its command waited in the queue): lives again.
    store.ensure_token(&TokenRecord { created_at: 3_000, ..record(9_000) }).await.unwrap();
    assert_eq!(read().await.expires_at, 9_000);
    // Used: never touched.
    store.execute("UPDATE idempotency_tokens SET state = 'in_use' WHERE token = $1", token.as_str()).await.unwrap();
    store.ensure_token(&TokenRecord { created_at: 20_000, ..record(99_000) }).await.unwrap();
    let used = read().await;
    assert_eq!((used.state, used.expires_at), (TokenState::InUse, 9_000));
    assert!(token.as_str().starts_with("mq:"));
    assert!(command_token(T, "R-9") == token && command_token("other", "R-9") != token);
}

/// A command for an order that does not exist (yet) keeps its answer: a redelivery after the order was created
/// answers the same bytes and charges nothing (`contracts/mq.md`: the same command, the same answer).
async fn a_command_for_an_unknown_order_keeps_its_answer<S: TestDb + PaymentStore>(store: S) {
    let channel = MockChannel::reliable();
    let p = Payments::new(store.clone(), Arc::new(channel.clone()), EngineConfig::default());
    let first = p.pay_command(T, &request("O-9", 1000, Some("R-9")), WAIT).await.unwrap();
    assert_eq!((first.status, code(&first.body)), (404, "order_not_found".into()));
    p.create_order(T, &order_no("O-9"), 1000, &cny()).await.unwrap();
    let again = p.pay_command(T, &request("O-9", 1000, Some("R-9")), WAIT).await.unwrap();
    assert_eq!((again.status, &again.body), (404, &first.body), "the same command, the same answer");
    let other = p.pay_command(T, &request("O-9", 999, Some("R-9")), WAIT).await.unwrap();
    assert_eq!((other.status, code(&other.body)), (422, "idempotency_key_mismatch".into()));
    assert_eq!(channel.ledger().charge_calls, 0);
}

/// A command sent again once its answer and its history are deleted (past the response and the history
/// retentions: a rerun job, a replay from a dead-letter queue) is still its own payment, never "another
/// payment's number" and never a second charge: a charge, a decline and a failure (`order_not_payable`) answer the
/// same bytes as before, and keep doing so.
async fn a_command_sent_again_after_its_retention_is_its_own_payment<S: TestDb + PaymentStore>(store: S) {
    const HOUR: i64 = 3_600_000;
    let clock = ManualClock::new(1_700_000_000_000);
    let retention = Retention {
        token_ttl: Duration::from_secs(3600),
        response_retention: Duration::from_secs(2 * 3600),
        history_retention: Duration::from_secs(3 * 3600),
    };
    let channel = MockChannel::reliable();
    let declining = channel.with_config(MockChannelConfig { decline_rate: 1.0, ..MockChannelConfig::default() });
    let service = |channel: MockChannel| {
        Payments::with_clock(store.clone(), Arc::new(channel), EngineConfig::default(), clock.clone())
            .with_retention(retention)
    };
    let (p, d) = (service(channel.clone()), service(declining));
    for order in ["O-1", "O-2"] {
        p.create_order(T, &order_no(order), 1000, &cny()).await.unwrap();
    }
    let paid = p.pay_command(T, &request("O-1", 1000, Some("R-1")), WAIT).await.unwrap();
    assert_eq!(paid.status, 201, "{}", paid.body);
    let declined = d.pay_command(T, &request("O-2", 1000, Some("R-2")), WAIT).await.unwrap();
    assert_eq!((declined.status, code(&declined.body)), (402, "payment_declined".into()));
    let refused = p.pay_command(T, &request("O-1", 1000, Some("R-3")), WAIT).await.unwrap();
    assert_eq!((refused.status, code(&refused.body)), (409, "order_not_payable".into()));
    clock.advance(4 * HOUR);
    let pass = p.retention_pass(false).await.unwrap().unwrap();
    assert_eq!((pass.used_tokens, pass.workflows), (3, 3), "{pass:?}");
    // Other fields under the numbers, arriving first: refused as such, never answered with the payments.
    p.create_order(T, &order_no("O-3"), 1000, &cny()).await.unwrap();
    for (order, amount, number) in [("O-3", 1000, "R-1"), ("O-1", 999, "R-1"), ("O-404", 1000, "R-2")] {
        let stray = p.pay_command(T, &request(order, amount, Some(number)), WAIT).await.unwrap();
        assert_eq!((stray.status, code(&stray.body)), (422, "idempotency_key_mismatch".into()), "{order} {number}");
    }
    assert_eq!(p.order(T, &order_no("O-3")).await.unwrap().unwrap().status, OrderStatus::Pending);
    for _ in 0..2 {
        let again = p.pay_command(T, &request("O-1", 1000, Some("R-1")), WAIT).await.unwrap();
        assert_eq!((again.status, &again.body), (201, &paid.body), "the charge, as first answered");
        let again = p.pay_command(T, &request("O-2", 1000, Some("R-2")), WAIT).await.unwrap();
        assert_eq!((again.status, &again.body), (402, &declined.body), "the decline, as first answered");
        let again = p.pay_command(T, &request("O-1", 1000, Some("R-3")), WAIT).await.unwrap();
        assert_eq!((again.status, &again.body), (409, &refused.body), "the failure, as first answered");
    }
    let other = p.pay_command(T, &request("O-1", 999, Some("R-1")), WAIT).await.unwrap();
    assert_eq!((other.status, code(&other.body)), (422, "idempotency_key_mismatch".into()));
    assert_eq!(channel.ledger().kept_charges("O-1"), 1);
    assert_eq!(channel.ledger().charge_calls, 2, "one call per command, none after");
    assert!(check_invariants(&store, &channel.ledger()).await.unwrap().is_empty());
}

/// A command delivered again while a retention pass deletes its expired, unused token (its command waited in the
/// queue past the ttl): whichever comes first, the command is paid, and the pass finishes. (Refused as an unknown
/// token, it would be answered `404`, acknowledged, and never paid.)
async fn a_command_delivered_while_a_pass_deletes_its_token_is_paid<S: TestDb + PaymentStore>(store: S) {
    const HOUR: i64 = 3_600_000;
    let clock = ManualClock::new(1_700_000_000_000);
    let retention = Retention { token_ttl: Duration::from_secs(3600), ..Retention::default() };
    let service = |store: S| {
        Payments::with_clock(store, Arc::new(MockChannel::reliable()), EngineConfig::default(), clock.clone())
            .with_retention(retention)
    };
    let (p, gc) = (service(store.clone()), service(store.another_pool().await.unwrap()));
    for i in 0..100 {
        let (order, number) = (format!("O-{i}"), format!("R-{i}"));
        p.create_order(T, &order_no(&order), 1000, &cny()).await.unwrap();
        let now = clock.now_ms();
        store.ensure_token(&unused(&command_token(T, &number), now, now + HOUR)).await.unwrap();
        clock.advance(2 * HOUR);
        let command = request(&order, 1000, Some(&number));
        let (pass, paid) = tokio::join!(gc.retention_pass(false), p.pay_command(T, &command, WAIT));
        pass.unwrap();
        let paid = paid.unwrap();
        assert_eq!(paid.status, 201, "round {i}: {}", paid.body);
    }
}

on_every_backend!(
    a_command_delivered_while_a_pass_deletes_its_token_is_paid,
    a_command_sent_again_after_its_retention_is_its_own_payment,
    a_command_for_an_unknown_order_keeps_its_answer,
    fifty_deliveries_of_one_command_charge_once,
    a_command_under_an_http_number_is_that_payment,
    a_mismatched_command_first_leaves_the_http_payment_the_answer,
    commands_answered_before_an_http_payment_took_their_number_keep_their_answers,
    a_command_for_an_unknown_order_under_an_http_number_leaves_it_the_answer,
    commands_racing_an_http_payment_under_its_number_keep_their_answers,
    a_token_marked_under_a_taken_number_is_never_settled,
    the_commands_token_is_ensured_revived_and_left_alone_once_used,
);
