//! `onceflow consume` against hostile producers, on a real RabbitMQ (`AMQP_URL`; skipped without it), with real
//! processes and a mock channel over HTTP (issue 35):
//!
//! - a poison message (not a command, with a header table that fills the broker's frame): it lands in
//!   `<queue>.dead` once, the three valid commands after it are answered, and the consumer never connects again;
//! - a command whose `reply_to` names a queue outside `--reply-to-prefix` (another tenant's command queue): never
//!   answered there, never paid, dead-lettered with the reason; answers to an allowed queue still flow;
//! - a broker that accepts messages over the consumer's 1 MiB limit is named at start-up (the consumer reads a
//!   delivery whole before it can refuse it: only the broker's `max_message_size` stops a giant one unread).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::mq::{Client, Fleet, ONCEFLOW, amqp_url, collect, serve_channel, terminate, unique};
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde_json::{Value, json};

fn command(order: usize, request_no: &str) -> Value {
    json!({"order_no": format!("O-{order}"), "amount": 1000, "currency": "CNY", "request_no": request_no})
}

/// One `onceflow consume` on `queue` with `extra` flags, its log (warnings and up) written to `log`.
fn consume(db: &str, channel_url: &str, amqp: &str, queue: &str, extra: &[&str], log: &std::path::Path) -> Child {
    Command::new(ONCEFLOW)
        .arg("consume")
        .args(["--database-url", db, "--channel-url", channel_url, "--amqp-url", amqp, "--queue", queue])
        .args(["--prefetch", "8", "--lease-ms", "1000", "--wait-ms", "10000"])
        .args(extra)
        .env("RUST_LOG", "warn")
        // The binary sets its own thread stack; one inherited from here would hide that it does not.
        .env_remove("RUST_MIN_STACK")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start onceflow consume")
}

fn log_path(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("onceflow-{what}-{}.log", uuid::Uuid::new_v4().simple()))
}

/// A header of the dead letter, as text.
fn header(d: &lapin::message::Delivery, name: &str) -> Option<String> {
    match d.properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// Issue 35, point 1: a message that is not a command, published with a header table that nearly fills the
/// broker's frame (130,900 bytes of padding), plus `reply_to` and `correlation_id`. Its copy in `<queue>.dead`
/// must not carry that table with the consumer's own headers added (a frame over the limit: the broker closes
/// the connection, the message comes back, again and again): it lands there once, the three valid commands
/// published after it are answered, and the consumer's connection is never lost.
#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_message_does_not_stop_the_consumer() {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    let db = common::database("sqlite").await.unwrap();
    common::create_orders(&db, 3).await;
    let (channel_url, channel) = serve_channel().await;
    let queue = unique("poison");
    let (dead, replies) = (format!("{queue}.dead"), format!("{queue}.replies"));
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    let (answers, _) = collect(&amqp, &replies);
    let log = log_path("poison");
    let mut fleet = Fleet(vec![consume(&db, &channel_url, &amqp, &queue, &[], &log)]);
    client.wait_consumers(&queue, 1).await;

    // As large as the broker takes from this publisher (its frame limit less the other properties, with this
    // test's long queue names), so that a copy with a few more headers is not.
    let mut headers = FieldTable::default();
    headers.insert("pad".into(), AMQPValue::LongString(LongString::from("x".repeat(130_900))));
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_correlation_id("poison".into())
        .with_reply_to(replies.as_str().into())
        .with_headers(headers);
    let confirm = client
        .channel
        .basic_publish("".into(), queue.as_str().into(), BasicPublishOptions::default(), b"not a command", properties)
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack(), "the broker refused the poison message: {confirm:?}");
    let ids: Vec<String> = (0..3).map(|o| format!("R-{o}")).collect();
    for (o, id) in ids.iter().enumerate() {
        client.command(&queue, &command(o, id), id, &replies).await;
    }
    answers.wait_for(&ids, Duration::from_secs(30)).await;
    for id in &ids {
        assert_eq!(answers.json(id)["status"], 201, "{id}");
    }

    let started = Instant::now();
    while client.counts(&dead).await.0 < 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "the poison message did not reach {dead}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(fleet.0[0].try_wait().unwrap().is_none(), "consume exited");
    let dead_letters = client.drain(&dead).await;
    assert_eq!(dead_letters.len(), 1, "dead-lettered more than once");
    let d = &dead_letters[0];
    assert_eq!(d.data, b"not a command");
    assert_eq!(header(d, "x-onceflow-error").as_deref(), Some("invalid_request"));
    assert_eq!(d.properties.correlation_id().as_ref().map(|c| c.as_str()), Some("poison"));
    assert!(terminate(&mut fleet.0[0]), "consume did not exit 0 on SIGTERM");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("broker connection lost"), "the consumer lost its connection:\n{logged}");
    assert_eq!(answers.count(), 3, "the poison message was answered");
    assert_eq!(channel.ledger().charge_calls, 3);
    assert_eq!(client.counts(&queue).await, (0, 0));
    client.delete(&queue).await;
    client.delete(&dead).await;
    client.delete(&replies).await;
}

/// A message that is not a command, its header table nested `DEPTH` deep (a few kilobytes: `{"k": {"k": …}}`).
/// The AMQP client parses (and drops) tables recursively: at the default 2 MiB stack, 300 levels overflowed the
/// consumer's thread and aborted `consume`, again at each restart while the message waited in the queue. It is
/// dead-lettered once (without the nested table), the command after it answered, the consumer alive.
#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deeply_nested_header_does_not_stop_the_consumer() {
    const DEPTH: usize = 300;
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    let db = common::database("sqlite").await.unwrap();
    common::create_orders(&db, 1).await;
    let (channel_url, _channel) = serve_channel().await;
    let queue = unique("nested");
    let (dead, replies) = (format!("{queue}.dead"), format!("{queue}.replies"));
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    let (answers, _) = collect(&amqp, &replies);
    let log = log_path("nested");
    let mut fleet = Fleet(vec![consume(&db, &channel_url, &amqp, &queue, &[], &log)]);
    client.wait_consumers(&queue, 1).await;

    // (300 levels: this test's own AMQP client serializes the table recursively on its connection's thread, at
    // the default stack; 2,000 overflowed it here.)
    let mut nested = FieldTable::default();
    for _ in 0..DEPTH {
        let mut outer = FieldTable::default();
        outer.insert("k".into(), AMQPValue::FieldTable(nested));
        nested = outer;
    }
    let properties = BasicProperties::default().with_delivery_mode(2).with_headers(nested);
    let confirm = client
        .channel
        .basic_publish("".into(), queue.as_str().into(), BasicPublishOptions::default(), b"not a command", properties)
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack(), "the broker refused the nested message: {confirm:?}");
    client.command(&queue, &command(0, "R-0"), "R-0", &replies).await;
    answers.wait_for(&["R-0".to_owned()], Duration::from_secs(30)).await;
    assert_eq!(answers.json("R-0")["status"], 201);
    let started = Instant::now();
    while client.counts(&dead).await.0 < 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "the nested message did not reach {dead}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(fleet.0[0].try_wait().unwrap().is_none(), "consume exited:\n{}", std::fs::read_to_string(&log).unwrap());
    let dead_letters = client.drain(&dead).await;
    assert_eq!(dead_letters.len(), 1, "dead-lettered more than once");
    assert_eq!(header(&dead_letters[0], "x-onceflow-error").as_deref(), Some("invalid_request"));
    assert!(dead_letters[0].properties.headers().as_ref().is_some_and(|h| !h.inner().contains_key("k")));
    assert!(terminate(&mut fleet.0[0]), "consume did not exit 0 on SIGTERM");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("broker connection lost"), "the consumer lost its connection:\n{logged}");
    client.delete(&queue).await;
    client.delete(&dead).await;
    client.delete(&replies).await;
}

/// Issue 35, point 8: answers go only to queues `--reply-to-prefix` allows (by default `<queue>.replies…` and
/// RabbitMQ's direct reply-to): a command whose `reply_to` names another queue — another tenant's command queue —
/// is a bad message, never paid and never answered there.
#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_go_only_where_reply_to_is_allowed() {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    let db = common::database("sqlite").await.unwrap();
    common::create_orders(&db, 3).await;
    let (channel_url, channel) = serve_channel().await;
    let queue = unique("replyto");
    let (dead, replies, victim) = (format!("{queue}.dead"), format!("{queue}.replies"), unique("victim"));
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    client.declare(&victim).await;
    let (answers, _) = collect(&amqp, &replies);
    let log = log_path("replyto");
    let mut fleet = Fleet(vec![consume(&db, &channel_url, &amqp, &queue, &[], &log)]);
    client.wait_consumers(&queue, 1).await;

    client.command(&queue, &command(0, "R-elsewhere"), "elsewhere", &victim).await;
    client.command(&queue, &command(1, "R-own"), "own", &replies).await;
    answers.wait_for(&["own".into()], Duration::from_secs(30)).await;
    assert_eq!(answers.json("own")["status"], 201);
    let started = Instant::now();
    while client.counts(&dead).await.0 < 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "the command answering elsewhere is not in {dead}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dead_letters = client.drain(&dead).await;
    assert_eq!(dead_letters.len(), 1);
    assert_eq!(header(&dead_letters[0], "x-onceflow-error").as_deref(), Some("invalid_request"));
    let detail = header(&dead_letters[0], "x-onceflow-detail").unwrap_or_default();
    assert!(detail.contains("reply_to"), "{detail}");
    assert_eq!(client.counts(&victim).await.0, 0, "an answer was written into another queue");
    assert_eq!(channel.ledger().kept_charges("O-0"), 0, "a command with a refused reply_to was paid");

    // An operator's prefix widens it.
    assert!(terminate(&mut fleet.0[0]));
    let prefix = victim.rsplit_once('.').unwrap().0.to_owned();
    fleet.0[0] = consume(&db, &channel_url, &amqp, &queue, &["--reply-to-prefix", &format!("{prefix}.")], &log);
    client.wait_consumers(&queue, 1).await;
    client.command(&queue, &command(2, "R-widened"), "widened", &victim).await;
    let started = Instant::now();
    while client.counts(&victim).await.0 < 1 {
        assert!(started.elapsed() < Duration::from_secs(30), "no answer in the queue the prefix allows");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(terminate(&mut fleet.0[0]));
    for q in [&queue, &dead, &replies, &victim] {
        client.delete(q).await;
    }
}

/// Issue 35, point 8: the consumer reads a delivery whole before it can see it is over 1 MiB (the client library
/// buffers it, up to the broker's `max_message_size` times the prefetch); only the broker can stop a giant
/// message unread. A broker that accepts messages over the limit is named at start-up, once.
#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_without_a_message_size_limit_is_named_at_start_up() {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    let db = common::database("sqlite").await.unwrap();
    common::create_orders(&db, 1).await;
    let (channel_url, _channel) = serve_channel().await;
    let queue = unique("size");
    let client = Client::connect(&amqp).await;
    let log = log_path("size");
    let mut fleet = Fleet(vec![consume(&db, &channel_url, &amqp, &queue, &[], &log)]);
    client.wait_consumers(&queue, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(terminate(&mut fleet.0[0]));
    let logged = std::fs::read_to_string(&log).unwrap();
    // The shared test broker keeps RabbitMQ's default limit (128 MiB).
    let warnings: Vec<&str> = logged.lines().filter(|l| l.contains("max_message_size")).collect();
    assert_eq!(warnings.len(), 1, "{logged}");
    client.delete(&queue).await;
    client.delete(&format!("{queue}.dead")).await;
}

/// Issue 35, point 1, the second guard: a bad message delivered again (its copy or the acknowledgement after it
/// was lost with the connection, however that came about) is not copied again but rejected, and the broker moves
/// it to `<queue>.dead` itself (`x-death`): no message brings the consumer back to it in a loop.
#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_message_delivered_again_is_rejected_not_copied() {
    use lapin::options::{BasicGetOptions, BasicNackOptions};
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    let db = common::database("sqlite").await.unwrap();
    common::create_orders(&db, 1).await;
    let (channel_url, _channel) = serve_channel().await;
    let queue = unique("again");
    let (dead, replies) = (format!("{queue}.dead"), format!("{queue}.replies"));
    let client = Client::connect(&amqp).await;
    client.declare(&replies).await;
    // The queue as the consumer declares it, from a first run.
    let log = log_path("again");
    let mut fleet = Fleet(vec![consume(&db, &channel_url, &amqp, &queue, &[], &log)]);
    client.wait_consumers(&queue, 1).await;
    assert!(terminate(&mut fleet.0[0]));
    // A bad message taken once and returned: the broker marks it redelivered.
    client.publish(&queue, b"not a command", Some("again"), Some(&replies)).await;
    let taken = client.channel.basic_get(queue.as_str().into(), BasicGetOptions::default()).await.unwrap().unwrap();
    taken.delivery.acker.nack(BasicNackOptions { multiple: false, requeue: true }).await.unwrap();

    fleet.0[0] = consume(&db, &channel_url, &amqp, &queue, &[], &log);
    let started = Instant::now();
    while client.counts(&dead).await.0 < 1 {
        assert!(started.elapsed() < Duration::from_secs(20), "the message did not reach {dead}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dead_letters = client.drain(&dead).await;
    assert_eq!(dead_letters.len(), 1);
    assert_eq!(dead_letters[0].data, b"not a command");
    assert!(header(&dead_letters[0], "x-death").is_some(), "not dead-lettered by the broker");
    assert!(header(&dead_letters[0], "x-onceflow-error").is_none(), "copied again");
    assert!(terminate(&mut fleet.0[0]));
    assert_eq!(client.counts(&queue).await, (0, 0));
    for q in [&queue, &dead, &replies] {
        client.delete(q).await;
    }
}
