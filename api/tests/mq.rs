//! `onceflow consume` against a real RabbitMQ (`AMQP_URL`; skipped without it): real processes, a mock channel
//! over HTTP whose ledger the tests judge by, a queue and a reply queue of each test's own.
//!
//! - a storm: commands published three times (two copies at once, one after the first answer), two consumers
//!   on one queue (Postgres, MySQL; one on SQLite), one SIGKILLed mid-stream and restarted: every order charged
//!   at most once, every copy answered, every answer of one `request_no` the same bytes, nothing left in the
//!   queue or unacknowledged, and per order exactly one event (its charged payment's `payment.succeeded`);
//! - a command under the `request_no` of an HTTP payment: that payment's answer, no new charge;
//! - bad messages: each in `<queue>.dead` with `x-onceflow-error: invalid_request`, once, the consumer still
//!   answering.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::mq::{
    Answers, Client, Consume, Fleet, amqp_url, collect, judge, kill, serve_channel, serve_mock, terminate, unique,
};
use lapin::types::AMQPValue;
use onceflow_api::Auth;
use onceflow_engine::{MySqlStore, PgStore, SqliteStore, Store};
use onceflow_payments::events::Position;
use onceflow_payments::{EventType, MockChannel, MockChannelConfig, PaymentStore, check_invariants};
use serde_json::{Value, json};

/// Creates `n` orders `O-0…` of 1000 CNY.
async fn orders(db: &str, n: usize) {
    common::create_orders(db, n).await;
}

fn command(order: usize, request_no: &str) -> Value {
    json!({"order_no": format!("O-{order}"), "amount": 1000, "currency": "CNY", "request_no": request_no})
}

/// The storm on `db` with `processes` consumers and `n_orders` orders (three request numbers each).
async fn storm<S: PaymentStore>(db: String, store: S, processes: usize, n_orders: usize) {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    let started = Instant::now();
    let (channel_url, channel) = serve_channel().await;
    let (queue, replies) = (unique("storm"), unique("storm.replies"));
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    let (answers, mut fresh) = collect(&amqp, &replies);
    orders(&db, n_orders).await;
    let consume = Consume { db, channel_url, amqp_url: amqp.clone(), queue: queue.clone(), prefetch: 16 };
    let children = Arc::new(Mutex::new(Fleet((0..processes).map(|_| consume.spawn()).collect())));
    client.wait_consumers(&queue, processes as u32).await;

    // Three request numbers per order, each command published three times under its own correlation ids.
    let commands: Vec<(String, Value)> = (0..n_orders)
        .flat_map(|o| ["a", "b", "c"].map(|k| (format!("R-{o}-{k}"), command(o, &format!("R-{o}-{k}")))))
        .collect();
    let bodies: HashMap<String, Value> = commands.iter().cloned().collect();
    let ids: Vec<String> = commands.iter().flat_map(|(r, _)| (0..3).map(move |c| format!("{r}/{c}"))).collect();
    let total = commands.len();

    // The third copy of a command goes out once its first answer is in.
    let third = {
        let (amqp, queue, replies) = (amqp.clone(), queue.clone(), replies.clone());
        tokio::spawn(async move {
            let client = Client::connect(&amqp).await;
            let mut sent = std::collections::HashSet::new();
            while let Some(id) = fresh.recv().await {
                let (request_no, copy) = id.rsplit_once('/').unwrap();
                // Once per request number: when the first of its two copies is answered.
                if copy != "2" && sent.insert(request_no.to_owned()) {
                    client.command(&queue, &bodies[request_no], &format!("{request_no}/2"), &replies).await;
                    if sent.len() == total {
                        return;
                    }
                }
            }
        })
    };

    // SIGKILL the first consumer once a third of the commands are answered, and start it again.
    let killer = {
        let (answers, children, consume) = (answers.clone(), children.clone(), consume.clone());
        tokio::spawn(async move {
            while answers.count() < total / 3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mut children = children.lock().unwrap();
            kill(&mut children.0[0]);
            children.0[0] = consume.spawn();
        })
    };

    for (request_no, body) in &commands {
        // Two copies back to back: with two consumers and a prefetch each, they run at the same time.
        client.command(&queue, body, &format!("{request_no}/0"), &replies).await;
        client.command(&queue, body, &format!("{request_no}/1"), &replies).await;
    }
    answers.wait_for(&ids, Duration::from_secs(90)).await;
    killer.await.unwrap();
    third.await.unwrap();

    // Stop every consumer gracefully: exit 0, then nothing ready or unacknowledged is left.
    for child in children.lock().unwrap().0.iter_mut() {
        assert!(terminate(child), "consume did not exit 0 on SIGTERM");
    }
    assert_eq!(client.counts(&queue).await, (0, 0), "messages left in the queue, or consumers");
    assert_eq!(client.counts(&format!("{queue}.dead")).await.0, 0, "good commands were dead-lettered");

    // Every answer of one request number the same bytes; per order one 201, the other two 409.
    let got = answers.snapshot();
    judge(&commands, 3, &got);
    let ledger = channel.ledger();
    for o in 0..n_orders {
        assert_eq!(ledger.kept_charges(&format!("O-{o}")), 1, "O-{o}");
    }
    let violations = check_invariants(&store, &ledger).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    // The event log: per order exactly one event, its charged payment's payment.succeeded, whatever was
    // redelivered or killed (the refusals before the channel write none).
    let events = succeeded_events(&store, n_orders).await;
    let mut of_orders: Vec<String> = events.iter().map(|(order, _)| order.clone()).collect();
    of_orders.sort_unstable();
    let mut expected: Vec<String> = (0..n_orders).map(|o| format!("O-{o}")).collect();
    expected.sort_unstable();
    assert_eq!(of_orders, expected, "one event per order");
    for (order, request_no) in &events {
        let number = onceflow_payments::RequestNo::parse(request_no).unwrap();
        let paid = store.payment("default", &number).await.unwrap().unwrap();
        assert_eq!(paid.status, onceflow_payments::PaymentStatus::Succeeded, "{order}: {request_no}");
    }
    let deliveries: usize = got.values().map(Vec::len).sum();
    println!(
        "storm: {total} commands × 3, {processes} consumers, {} answers received ({} repeats of an answer), \
         {} charge calls, {:.1} s",
        deliveries,
        deliveries - ids.len(),
        ledger.charge_calls,
        started.elapsed().as_secs_f64()
    );
    delete_queues(&client, &queue, &replies).await;
}

/// The order and payment of every event in the log, once there are `expected` (the Postgres log shows an event
/// once every older write transaction has ended) and a moment later; each asserted `payment.succeeded`.
async fn succeeded_events<S: PaymentStore>(store: &S, expected: usize) -> Vec<(String, String)> {
    let read = async || {
        // MySQL numbers committed events after their commit (its sequencer); elsewhere a no-op.
        store.sequence().await.unwrap();
        store.events_after(None, &Position::start(), &[], 10_000).await.unwrap().events
    };
    let started = Instant::now();
    while read().await.len() < expected && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    read()
        .await
        .iter()
        .map(|e| {
            assert_eq!(e.kind, EventType::PaymentSucceeded, "{e:?}");
            let data: Value = serde_json::from_str(&e.data).unwrap();
            (data["order_no"].as_str().unwrap().to_owned(), data["request_no"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[cfg_attr(any(onceflow_no_postgres, onceflow_no_amqp), ignore = "DATABASE_URL or AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_redelivered_commands_charges_once_postgres() {
    let Some(db) = onceflow_tests::pg_url().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let store = PgStore::connect(&db, 2).await.unwrap();
    storm(db, store, 2, 100).await;
}

#[cfg_attr(any(onceflow_no_mysql, onceflow_no_amqp), ignore = "MYSQL_URL or AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_redelivered_commands_charges_once_mysql() {
    let Some(db) = onceflow_tests::mysql_url().await.unwrap() else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    let store = MySqlStore::connect(&db, 2).await.unwrap();
    storm(db, store, 2, 100).await;
}

#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_redelivered_commands_charges_once_sqlite() {
    let db = common::database("sqlite").await.unwrap();
    orders(&db, 0).await; // creates and migrates the file
    let store = SqliteStore::connect(&db).await.unwrap();
    storm(db, store, 1, 30).await;
}

/// `serve` on Postgres and one `onceflow consume` on a queue of its own (named from `name`), with the mock channel
/// both charge, a client and the reply queue's answers; `None` (skipped, said on stderr) without `AMQP_URL` or
/// `DATABASE_URL`.
struct BesideHttp {
    app: common::App,
    channel: MockChannel,
    client: Client,
    answers: Answers,
    queue: String,
    replies: String,
    fleet: Fleet,
}

async fn beside_http(name: &str) -> Option<BesideHttp> {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return None;
    };
    let Some(db) = onceflow_tests::pg_url().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return None;
    };
    let (channel_url, channel) = serve_channel().await;
    let app = common::start(&db, Arc::new(channel.clone()), Auth::SingleTenant).await;
    let (queue, replies) = (unique(name), unique(&format!("{name}.replies")));
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    let (answers, _) = collect(&amqp, &replies);
    let consume = Consume { db, channel_url, amqp_url: amqp, queue: queue.clone(), prefetch: 8 };
    let fleet = Fleet(vec![consume.spawn()]);
    client.wait_consumers(&queue, 1).await;
    Some(BesideHttp { app, channel, client, answers, queue, replies, fleet })
}

#[cfg_attr(any(onceflow_no_postgres, onceflow_no_amqp), ignore = "DATABASE_URL or AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_under_an_http_payments_number_is_that_payment() {
    let Some(BesideHttp { app, channel, client, answers, queue, replies, mut fleet }) = beside_http("http").await
    else {
        return;
    };

    // Paid over HTTP, then the same payment as a command: its status and body, no new charge call.
    let (paid, calls) = paid_h1(&app, &channel).await;
    client.command(&queue, &command(1, "H-1"), "same", &replies).await;
    client.command(&queue, &command(1, "H-1"), "same again", &replies).await;
    let mut other = command(1, "H-1");
    other["amount"] = json!(999);
    client.command(&queue, &other, "other", &replies).await;
    // Refused over HTTP (not the order's amount: 422, stored), then as a command: the same 422.
    app.order("O-2", 500).await;
    let refused = app
        .pay(&app.token().await, json!({"order_no": "O-2", "amount": 1000, "currency": "CNY", "request_no": "H-2"}))
        .await;
    assert_eq!(refused.status, 422, "{}", refused.text);
    client
        .command(
            &queue,
            &json!({"order_no": "O-2", "amount": 1000, "currency": "CNY", "request_no": "H-2"}),
            "refused",
            &replies,
        )
        .await;
    let ids = ["same", "same again", "other", "refused"].map(String::from);
    answers.wait_for(&ids, Duration::from_secs(30)).await;
    let got = answers.snapshot();
    assert_eq!(got["same"], got["same again"], "a repeated command answered differently");

    let same = answers.json("same");
    assert_eq!(same["status"], 201);
    assert_eq!(same["body"], serde_json::from_str::<Value>(&paid.text).unwrap());
    let other = answers.json("other");
    assert_eq!(
        (other["status"].clone(), other["body"]["code"].clone()),
        (json!(422), json!("idempotency_key_mismatch"))
    );
    let refused_answer = answers.json("refused");
    assert_eq!(refused_answer["status"], 422);
    assert_eq!(refused_answer["body"], serde_json::from_str::<Value>(&refused.text).unwrap());
    let ledger = channel.ledger();
    assert_eq!(ledger.charge_calls, calls, "a command charged again");
    assert_eq!(ledger.kept_charges("O-1"), 1);

    // The other way round: a command pays, then HTTP under the same number is refused, never charged.
    app.order("O-3", 1000).await;
    client.command(&queue, &command(3, "Q-3"), "queued", &replies).await;
    answers.wait_for(&["queued".into()], Duration::from_secs(30)).await;
    assert_eq!(answers.json("queued")["status"], 201);
    let again = app.pay(&app.token().await, command(3, "Q-3")).await;
    assert_eq!(again.status, 409, "{}", again.text);
    assert_eq!(channel.ledger().kept_charges("O-3"), 1);

    assert!(terminate(&mut fleet.0[0]));
    assert_eq!(client.counts(&queue).await, (0, 0));
    delete_queues(&client, &queue, &replies).await;
}

/// A command with other fields under an HTTP payment's number, delivered first, takes the command's token (bound
/// to its fields) and is refused; a command with the payment's own fields, after it, is still that payment. Seen
/// as a flaky `a_command_under_an_http_payments_number_is_that_payment` when the consumer took `other` before
/// `same`.
#[cfg_attr(any(onceflow_no_postgres, onceflow_no_amqp), ignore = "DATABASE_URL or AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mismatched_command_first_leaves_the_http_payment_the_answer() {
    let Some(BesideHttp { app, channel, client, answers, queue, replies, mut fleet }) = beside_http("first").await
    else {
        return;
    };

    let (paid, calls) = paid_h1(&app, &channel).await;
    let mut other = command(1, "H-1");
    other["amount"] = json!(999);
    client.command(&queue, &other, "other", &replies).await;
    answers.wait_for(&["other".into()], Duration::from_secs(30)).await;
    let other = answers.json("other");
    assert_eq!(
        (other["status"].clone(), other["body"]["code"].clone()),
        (json!(422), json!("idempotency_key_mismatch"))
    );
    client.command(&queue, &command(1, "H-1"), "same", &replies).await;
    answers.wait_for(&["same".into()], Duration::from_secs(30)).await;
    let same = answers.json("same");
    assert_eq!(same["status"], 201, "{same}");
    assert_eq!(same["body"], serde_json::from_str::<Value>(&paid.text).unwrap());
    assert_eq!(channel.ledger().charge_calls, calls, "a command charged again");

    assert!(terminate(&mut fleet.0[0]));
    delete_queues(&client, &queue, &replies).await;
}

/// Order `O-1` paid over HTTP under `H-1` (it must be charged), and the channel's charge calls then.
async fn paid_h1(app: &common::App, channel: &MockChannel) -> (common::Answer, u64) {
    app.order("O-1", 1000).await;
    let paid = app.pay(&app.token().await, command(1, "H-1")).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    (paid, channel.ledger().charge_calls)
}

/// Deletes a test's queue, its dead-letter queue and its reply queue.
async fn delete_queues(client: &Client, queue: &str, replies: &str) {
    client.delete(queue).await;
    client.delete(&format!("{queue}.dead")).await;
    client.delete(replies).await;
}

#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_messages_are_dead_lettered_once_with_their_code() {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    let db = common::database("sqlite").await.unwrap();
    orders(&db, 1).await;
    let (channel_url, channel) = serve_channel().await;
    let (queue, replies) = (unique("bad"), unique("bad.replies"));
    let dead = format!("{queue}.dead");
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    let (answers, _) = collect(&amqp, &replies);
    let consume = Consume { db, channel_url, amqp_url: amqp.clone(), queue: queue.clone(), prefetch: 8 };
    let mut fleet = Fleet(vec![consume.spawn()]);
    client.wait_consumers(&queue, 1).await;

    let valid = command(0, "R-ok");
    let with = |field: &str, value: Value| {
        let mut v = valid.clone();
        v[field] = value;
        v.to_string().into_bytes()
    };
    let without = |field: &str| {
        let mut v = valid.clone();
        v.as_object_mut().unwrap().remove(field);
        v.to_string().into_bytes()
    };
    let mut huge = valid.clone();
    huge["pad"] = json!("x".repeat(10 * 1024 * 1024));
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("not json", b"not json".to_vec()),
        ("empty", Vec::new()),
        ("empty object", b"{}".to_vec()),
        ("array", b"[1,2]".to_vec()),
        ("no request_no", without("request_no")),
        ("no order_no", without("order_no")),
        ("no amount", without("amount")),
        ("no currency", without("currency")),
        ("amount 0", with("amount", json!(0))),
        ("amount -5", with("amount", json!(-5))),
        ("amount as text", with("amount", json!("1000"))),
        ("amount 10.5", with("amount", json!(10.5))),
        ("lower-case currency", with("currency", json!("cny"))),
        ("four-letter currency", with("currency", json!("CNYX"))),
        ("empty order_no", with("order_no", json!(""))),
        ("order_no with a space", with("order_no", json!("O 1"))),
        ("request_no ..", with("request_no", json!(".."))),
        ("request_no of 65", with("request_no", json!("R".repeat(65)))),
        ("a token field", with("token", json!("tok_x"))),
        ("10 MiB", huge.to_string().into_bytes()),
        // Its parse error quotes 200 KB of input: the dead-letter copy must not carry it (a header frame over the
        // broker's limit closes the connection, and the message would come back forever).
        ("amount of 200 KB text", with("amount", json!("9".repeat(200_000)))),
    ];
    assert_eq!(bad.len(), 21);
    for (name, body) in &bad {
        client.publish(&queue, body, Some(name), Some(&replies)).await;
    }
    // A command without reply_to cannot be answered: bad too.
    client.publish(&queue, valid.to_string().as_bytes(), Some("no reply_to"), None).await;
    client.command(&queue, &valid, "valid", &replies).await;
    answers.wait_for(&["valid".into()], Duration::from_secs(30)).await;
    assert_eq!(answers.json("valid")["status"], 201, "the consumer stopped answering");

    let started = Instant::now();
    while client.counts(&dead).await.0 < 22 {
        assert!(started.elapsed() < Duration::from_secs(10), "not all bad messages reached {dead}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Never delivered again: a second later nothing more has arrived anywhere.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(fleet.0[0].try_wait().unwrap().is_none(), "consume exited");
    let dead_letters = client.drain(&dead).await;
    assert_eq!(dead_letters.len(), 22, "dead-lettered more than once");
    let mut names: Vec<String> = Vec::new();
    for d in &dead_letters {
        let headers = d.properties.headers().clone().unwrap_or_default();
        let code = headers.inner().get("x-onceflow-error").cloned();
        assert!(
            matches!(&code, Some(AMQPValue::LongString(s)) if s.to_string() == "invalid_request"),
            "{:?}: {code:?}",
            d.properties.correlation_id()
        );
        let name = d.properties.correlation_id().as_ref().map(|c| c.to_string()).unwrap_or_default();
        let sent = bad.iter().find(|(n, _)| *n == name).map_or(valid.to_string().into_bytes(), |(_, b)| b.clone());
        assert_eq!(d.data, sent, "{name}: the dead letter is not the message");
        names.push(name);
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 22);
    assert_eq!(answers.count(), 1, "a bad message was answered");
    assert_eq!(channel.ledger().charge_calls, 1);
    assert!(terminate(&mut fleet.0[0]));
    assert_eq!(client.counts(&queue).await, (0, 0));
    client.delete(&queue).await;
    client.delete(&dead).await;
    client.delete(&replies).await;
}

/// A value of the Prometheus text at `url` (`0` when absent).
async fn metric(url: &str, line_start: &str) -> f64 {
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(line_start)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
}

/// Waits up to 10 s for the metric at `url` to read `value`, and returns what it read last. The answer reaches its
/// queue before the consumer hears the broker's confirm, acknowledges the command and counts it: a read right
/// after the answer may come too early.
async fn metric_reaches(url: &str, line_start: &str, value: f64) -> f64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let read = metric(url, line_start).await;
        if read == value || tokio::time::Instant::now() > deadline {
            return read;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg_attr(any(onceflow_no_postgres, onceflow_no_amqp), ignore = "DATABASE_URL or AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storage_outage_returns_the_command_to_the_queue() {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    let Some(db) = onceflow_tests::pg_url().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    orders(&db, 1).await;
    let name = db.rsplit('/').next().unwrap().to_owned();
    let admin = PgStore::connect(&std::env::var("DATABASE_URL").unwrap(), 1).await.unwrap();
    let (channel_url, channel) = serve_channel().await;
    let (queue, replies) = (unique("outage"), unique("outage.replies"));
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    let (answers, _) = collect(&amqp, &replies);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let consume = Consume { db, channel_url, amqp_url: amqp.clone(), queue: queue.clone(), prefetch: 8 };
    let mut fleet = Fleet(vec![consume.spawn_with(&["--metrics-listen", &listen])]);
    client.wait_consumers(&queue, 1).await;

    // The database refuses every connection (this test's database alone).
    let sql = |s: String| sqlx::query(sqlx::AssertSqlSafe(s));
    sql(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false")).execute(admin.pool()).await.unwrap();
    sql(format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        .execute(admin.pool())
        .await
        .unwrap();
    client.command(&queue, &command(0, "R-outage"), "outage", &replies).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let metrics = format!("http://{listen}/metrics");
    let requeued = metric(&metrics, "onceflow_mq_commands_total{outcome=\"requeued\"}").await;
    assert!(requeued >= 1.0, "the command was not returned to the queue during the outage");
    assert_eq!(answers.count(), 0, "answered without a database");
    assert_eq!(client.counts(&format!("{queue}.dead")).await.0, 0, "an outage is not a bad message");
    assert!(fleet.0[0].try_wait().unwrap().is_none(), "consume exited");

    // Back: the command, delivered again, is paid once.
    sql(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true")).execute(admin.pool()).await.unwrap();
    answers.wait_for(&["outage".into()], Duration::from_secs(30)).await;
    assert_eq!(answers.json("outage")["status"], 201);
    assert_eq!(channel.ledger().kept_charges("O-0"), 1);
    assert_eq!(metric_reaches(&metrics, "onceflow_mq_commands_total{outcome=\"2xx\"}", 1.0).await, 1.0);
    assert_eq!(metric_reaches(&metrics, "onceflow_mq_in_flight", 0.0).await, 0.0);
    assert!(terminate(&mut fleet.0[0]));
    assert_eq!(client.counts(&queue).await, (0, 0));
    delete_queues(&client, &queue, &replies).await;
}

#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_finishes_the_commands_in_flight_and_returns_the_rest() {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    const N: usize = 40;
    let db = common::database("sqlite").await.unwrap();
    orders(&db, N).await;
    let config = MockChannelConfig { latency_ms: 200, ..MockChannelConfig::default() };
    let (channel_url, channel) = serve_mock(MockChannel::new(config)).await;
    let (queue, replies) = (unique("term"), unique("term.replies"));
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    let (answers, _) = collect(&amqp, &replies);
    let consume = Consume { db: db.clone(), channel_url, amqp_url: amqp.clone(), queue: queue.clone(), prefetch: 8 };
    let mut fleet = Fleet(vec![consume.spawn()]);
    client.wait_consumers(&queue, 1).await;
    let ids: Vec<String> = (0..N).map(|o| format!("R-{o}")).collect();
    for (o, id) in ids.iter().enumerate() {
        client.command(&queue, &command(o, id), id, &replies).await;
    }
    while answers.count() < 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Mid-stream: the ones in flight are finished (answered, then acknowledged), the rest stay queued.
    assert!(terminate(&mut fleet.0[0]), "consume did not exit 0 on SIGTERM");
    let answered = answers.count();
    let (ready, consumers) = client.counts(&queue).await;
    assert_eq!(consumers, 0);
    assert!(answered < N, "the stop came after the run");
    assert_eq!(answered + ready as usize, N, "a command was lost or left unacknowledged");

    fleet.0[0] = consume.spawn();
    answers.wait_for(&ids, Duration::from_secs(30)).await;
    assert!(answers.snapshot().values().all(|a| a.len() == 1), "a command finished before the stop ran again");
    let store = SqliteStore::connect(&db).await.unwrap();
    assert!(check_invariants(&store, &channel.ledger()).await.unwrap().is_empty());
    assert!(terminate(&mut fleet.0[0]));
    assert_eq!(client.counts(&queue).await, (0, 0));
    delete_queues(&client, &queue, &replies).await;
}
