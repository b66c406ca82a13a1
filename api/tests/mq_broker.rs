//! The broker restarted under `onceflow consume` (`rabbitmqctl stop_app`, then `start_app`) while commands
//! are in flight: the consumers connect again by themselves, and the run ends as if nothing happened — every
//! command answered, the same bytes for every answer of one `request_no`, every order charged once, nothing
//! left in the queue. It stops the shared broker, so it is a test binary of its own (cargo runs test binaries
//! one after another, so no other broker test runs meanwhile). Needs `AMQP_URL` and a local `rabbitmqctl`.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::mq::{Client, Consume, Fleet, amqp_url, collect, judge, serve_mock, terminate, unique};
use onceflow_engine::{PgStore, SqliteStore};
use onceflow_payments::{MockChannel, MockChannelConfig, PaymentStore, check_invariants};
use serde_json::{Value, json};

fn rabbitmqctl(args: &[&str]) {
    let status = Command::new("rabbitmqctl").args(args).status().expect("run rabbitmqctl");
    assert!(status.success(), "rabbitmqctl {args:?} failed");
}

#[cfg_attr(onceflow_no_amqp, ignore = "AMQP_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_outlive_a_broker_restart() {
    let Some(amqp) = amqp_url() else {
        eprintln!("skipped: AMQP_URL is not set");
        return;
    };
    if Command::new("rabbitmqctl").arg("status").output().is_err() {
        eprintln!("skipped: no rabbitmqctl to restart the broker with");
        return;
    }
    match onceflow_tests::pg_url().await.unwrap() {
        Some(db) => {
            let store = PgStore::connect(&db, 2).await.unwrap();
            restart_run(&amqp, db, store, 2).await;
        }
        None => {
            let db = common::database("sqlite").await.unwrap();
            common::create_orders(&db, 0).await;
            let store = SqliteStore::connect(&db).await.unwrap();
            restart_run(&amqp, db, store, 1).await;
        }
    }
}

async fn restart_run<S: PaymentStore>(amqp: &str, db: String, store: S, processes: usize) {
    const ORDERS: usize = 60;
    // A slow channel keeps payments in flight while the broker goes away.
    let config = MockChannelConfig { latency_ms: 150, ..MockChannelConfig::default() };
    let (channel_url, channel) = serve_mock(MockChannel::new(config)).await;
    common::create_orders(&db, ORDERS).await;
    let (queue, replies) = (unique("restart"), unique("restart.replies"));
    let client = Client::connect(amqp).await;
    client.declare(&replies).await;
    let (answers, _) = collect(amqp, &replies);
    let consume = Consume { db, channel_url, amqp_url: amqp.to_owned(), queue: queue.clone(), prefetch: 4 };
    let mut children = Fleet((0..processes).map(|_| consume.spawn()).collect());
    client.wait_consumers(&queue, processes as u32).await;

    // Two request numbers per order, each command published twice.
    let commands: Vec<(String, Value)> = (0..ORDERS)
        .flat_map(|o| {
            ["a", "b"].map(|k| {
                let request_no = format!("R-{o}-{k}");
                let body =
                    json!({"order_no": format!("O-{o}"), "amount": 1000, "currency": "CNY", "request_no": request_no});
                (request_no, body)
            })
        })
        .collect();
    let ids: Vec<String> = commands.iter().flat_map(|(r, _)| (0..2).map(move |c| format!("{r}/{c}"))).collect();
    for (request_no, body) in &commands {
        for copy in 0..2 {
            client.command(&queue, body, &format!("{request_no}/{copy}"), &replies).await;
        }
    }
    drop(client);

    // Restart the broker once the first answers are in.
    let started = Instant::now();
    while answers.count() < 10 {
        assert!(started.elapsed() < Duration::from_secs(30), "no answers before the restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rabbitmqctl(&["stop_app"]);
    let answered_before = answers.count();
    tokio::time::sleep(Duration::from_secs(1)).await;
    rabbitmqctl(&["start_app"]);
    rabbitmqctl(&["await_startup"]);
    assert!(answered_before < ids.len(), "the restart came after the run: nothing was in flight");

    answers.wait_for(&ids, Duration::from_secs(60)).await;
    for child in &mut children.0 {
        assert!(child.try_wait().unwrap().is_none(), "a consumer exited when the broker went away");
    }
    for child in &mut children.0 {
        assert!(terminate(child), "consume did not exit 0 on SIGTERM");
    }
    let client = Client::connect(amqp).await;
    assert_eq!(client.counts(&queue).await, (0, 0), "messages left in the queue, or consumers");
    let got: HashMap<String, Vec<Vec<u8>>> = answers.snapshot();
    judge(&commands, 2, &got);
    let ledger = channel.ledger();
    for o in 0..ORDERS {
        assert_eq!(ledger.kept_charges(&format!("O-{o}")), 1, "O-{o}");
    }
    let violations = check_invariants(&store, &ledger).await.unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    let deliveries: usize = got.values().map(Vec::len).sum();
    println!(
        "broker restart: {} commands × 2, {processes} consumers, {answered_before} answered before the stop, \
         {deliveries} answers received, {:.1} s",
        commands.len(),
        started.elapsed().as_secs_f64()
    );
    client.delete(&queue).await;
    client.delete(&format!("{queue}.dead")).await;
    client.delete(&replies).await;
}
