//! For the message-queue tests: the broker from `AMQP_URL`, `onceflow consume` processes, a publisher with
//! confirms, a collector of answers that survives a broker restart, and the mock channel over HTTP.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use onceflow_payments::{MockChannel, mock_channel_router};
use tokio::sync::mpsc;

pub const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");

/// The broker of `AMQP_URL`; `None` (the test skips) when it is not set.
pub fn amqp_url() -> Option<String> {
    std::env::var("AMQP_URL").ok().filter(|u| !u.is_empty())
}

/// A queue name of this test alone.
pub fn unique(what: &str) -> String {
    format!("onceflow.test.{what}.{}", uuid::Uuid::new_v4().simple())
}

/// A reliable mock channel served over HTTP on a loopback port: its URL, and the channel (its ledger).
pub async fn serve_channel() -> (String, MockChannel) {
    serve_mock(MockChannel::reliable()).await
}

/// `channel` served over HTTP on a loopback port: its URL, and the channel.
pub async fn serve_mock(channel: MockChannel) -> (String, MockChannel) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, mock_channel_router(channel.clone())).into_future());
    (url, channel)
}

/// How to start `onceflow consume` processes on one queue.
#[derive(Clone)]
pub struct Consume {
    pub db: String,
    pub channel_url: String,
    pub amqp_url: String,
    pub queue: String,
    pub prefetch: u16,
}

impl Consume {
    /// Starts one `onceflow consume`. The caller stops and reaps it.
    pub fn spawn(&self) -> Child {
        self.spawn_with(&[])
    }

    /// Starts one `onceflow consume` with `extra` flags. Answers may go to every test queue (`onceflow.test.…`:
    /// each test's reply queue has a name of its own, not `<queue>.replies`).
    pub fn spawn_with(&self, extra: &[&str]) -> Child {
        let log = std::env::var("ONCEFLOW_TEST_LOG").is_ok();
        Command::new(ONCEFLOW)
            .arg("consume")
            .args(extra)
            .args(["--database-url", &self.db, "--channel-url", &self.channel_url])
            .args(["--amqp-url", &self.amqp_url, "--queue", &self.queue, "--tenant", "default"])
            .args(["--prefetch", &self.prefetch.to_string(), "--lease-ms", "1000", "--wait-ms", "10000"])
            .args(["--reply-to-prefix", "onceflow.test."])
            .env("RUST_LOG", if log { "info" } else { "error" })
            .stdout(Stdio::null())
            .stderr(if log { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .expect("start onceflow consume")
    }
}

/// SIGTERM, then waits up to 20 s for the exit; whether it exited 0.
pub fn terminate(child: &mut Child) -> bool {
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.success();
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Child processes, SIGKILLed when dropped: a failing test leaves none behind.
pub struct Fleet(pub Vec<Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.0 {
            kill(child);
        }
    }
}

/// SIGKILL and reap.
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A connection with a channel in confirm mode, for publishing and inspecting queues.
pub struct Client {
    pub connection: Connection,
    pub channel: Channel,
}

impl Client {
    pub async fn connect(url: &str) -> Self {
        let connection = Connection::connect(url, ConnectionProperties::default()).await.expect("connect to AMQP_URL");
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        Self { connection, channel }
    }

    /// Declares a durable queue (for answers).
    pub async fn declare(&self, queue: &str) {
        self.channel.queue_declare(queue.into(), QueueDeclareOptions::durable(), FieldTable::default()).await.unwrap();
    }

    /// Publishes a persistent message to `queue` and waits for the broker's confirm.
    pub async fn publish(&self, queue: &str, body: &[u8], correlation_id: Option<&str>, reply_to: Option<&str>) {
        let mut properties =
            BasicProperties::default().with_delivery_mode(2).with_content_type("application/json".into());
        if let Some(c) = correlation_id {
            properties = properties.with_correlation_id(c.into());
        }
        if let Some(r) = reply_to {
            properties = properties.with_reply_to(r.into());
        }
        let confirm = self
            .channel
            .basic_publish("".into(), queue.into(), BasicPublishOptions::default(), body, properties)
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(matches!(confirm, Confirmation::Ack(_)), "the broker refused a command: {confirm:?}");
    }

    /// A command's JSON.
    pub async fn command(&self, queue: &str, body: &serde_json::Value, correlation_id: &str, reply_to: &str) {
        self.publish(queue, body.to_string().as_bytes(), Some(correlation_id), Some(reply_to)).await;
    }

    /// `(messages ready, consumers)` of a queue, by a passive declare (on a channel of its own: a passive
    /// declare of a missing queue closes its channel).
    pub async fn counts(&self, queue: &str) -> (u32, u32) {
        let channel = self.connection.create_channel().await.unwrap();
        let q = channel
            .queue_declare(queue.into(), QueueDeclareOptions::durable().passive(), FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("queue {queue}: {e}"));
        let _ = channel.close(200, "ok".into()).await;
        (q.message_count(), q.consumer_count())
    }

    /// Waits until `queue` exists with at least `n` consumers.
    pub async fn wait_consumers(&self, queue: &str, n: u32) {
        let started = Instant::now();
        loop {
            let channel = self.connection.create_channel().await.unwrap();
            let q =
                channel.queue_declare(queue.into(), QueueDeclareOptions::durable().passive(), FieldTable::default());
            if let Ok(q) = q.await {
                let _ = channel.close(200, "ok".into()).await;
                if q.consumer_count() >= n {
                    return;
                }
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{n} consumers did not come up on {queue}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Takes every message of `queue` (acknowledged).
    pub async fn drain(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let mut all = Vec::new();
        while let Some(m) = self.channel.basic_get(queue.into(), BasicGetOptions::default()).await.unwrap() {
            m.delivery.acker.ack(BasicAckOptions::default()).await.unwrap();
            all.push(m.delivery);
        }
        all
    }

    pub async fn delete(&self, queue: &str) {
        let _ = self.channel.queue_delete(queue.into(), QueueDeleteOptions::default()).await;
    }
}

/// Every answer received, by correlation id, as bytes.
#[derive(Clone, Default)]
pub struct Answers(pub Arc<Mutex<HashMap<String, Vec<Vec<u8>>>>>);

impl Answers {
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn snapshot(&self) -> HashMap<String, Vec<Vec<u8>>> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until `ids` are all answered; panics after `limit`.
    pub async fn wait_for(&self, ids: &[String], limit: Duration) {
        let started = Instant::now();
        loop {
            let missing: Vec<String> = {
                let map = self.0.lock().unwrap();
                ids.iter().filter(|id| !map.contains_key(*id)).cloned().collect()
            };
            if missing.is_empty() {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "{} commands unanswered after {limit:?}, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One answer as JSON.
    pub fn json(&self, id: &str) -> serde_json::Value {
        let map = self.0.lock().unwrap();
        serde_json::from_slice(&map[id][0]).unwrap()
    }
}

/// Consumes `queue` (manual acks) into [`Answers`], connecting again after any broker failure; each new
/// correlation id is also sent to the returned receiver.
pub fn collect(url: &str, queue: &str) -> (Answers, mpsc::UnboundedReceiver<String>) {
    let answers = Answers::default();
    let (tx, rx) = mpsc::unbounded_channel();
    let (url, queue, into) = (url.to_owned(), queue.to_owned(), answers.clone());
    tokio::spawn(async move {
        loop {
            let consumed = async {
                // Bounded: a broker that is starting may accept the connection and not answer its handshake.
                let setup = async {
                    let connection = Connection::connect(&url, ConnectionProperties::default()).await?;
                    let channel = connection.create_channel().await?;
                    channel
                        .queue_declare(queue.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default())
                        .await?;
                    let consumer = channel
                        .basic_consume(
                            queue.as_str().into(),
                            "".into(),
                            BasicConsumeOptions::default(),
                            FieldTable::default(),
                        )
                        .await?;
                    Ok::<_, lapin::Error>((connection, channel, consumer))
                };
                let Ok(set) = tokio::time::timeout(Duration::from_secs(10), setup).await else {
                    return Ok(());
                };
                let (_connection, _channel, mut consumer) = set?;
                while let Some(delivery) = consumer.next().await {
                    let delivery = delivery?;
                    let id = delivery.properties.correlation_id().as_ref().map(|c| c.to_string()).unwrap_or_default();
                    let fresh = {
                        let mut map = into.0.lock().unwrap();
                        let entry = map.entry(id.clone()).or_default();
                        entry.push(delivery.data.clone());
                        entry.len() == 1
                    };
                    if fresh {
                        let _ = tx.send(id);
                    }
                    delivery.acker.ack(BasicAckOptions::default()).await?;
                }
                Ok::<_, lapin::Error>(())
            };
            let _ = consumed.await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    (answers, rx)
}

/// Checks the answers of `commands` (request number, body), each published under the correlation ids
/// `<request_no>/<copy>` for `copies` copies: every answer of one request number the same bytes, and per order
/// exactly one `201`, the others `409 order_not_payable`.
pub fn judge(commands: &[(String, serde_json::Value)], copies: usize, got: &HashMap<String, Vec<Vec<u8>>>) {
    let mut by_order: HashMap<String, Vec<u64>> = HashMap::new();
    for (request_no, body) in commands {
        let all: Vec<&Vec<u8>> = (0..copies).flat_map(|c| &got[&format!("{request_no}/{c}")]).collect();
        let text: Vec<_> = all.iter().map(|a| String::from_utf8_lossy(a)).collect();
        assert!(all.iter().all(|a| *a == all[0]), "{request_no} answered differently: {text:?}");
        let answer: serde_json::Value = serde_json::from_slice(all[0]).unwrap();
        let status = answer["status"].as_u64().unwrap();
        match status {
            201 => assert_eq!(answer["body"]["request_no"], *request_no),
            409 => assert_eq!(answer["body"]["code"], "order_not_payable", "{answer}"),
            other => panic!("{request_no}: {other} {answer}"),
        }
        by_order.entry(body["order_no"].as_str().unwrap().to_owned()).or_default().push(status);
    }
    for (order, statuses) in &by_order {
        assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{order}: {statuses:?}");
    }
}
