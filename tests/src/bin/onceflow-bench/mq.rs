//! The `mq/postgres` scenario: payment commands through `onceflow consume` (`contracts/mq.md`), each published
//! with a confirm and timed until its answer arrives on the reply queue; the same orders, pool and mock
//! channel as `http/postgres`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::oneshot;

use super::measure::{Run, drive};
use super::options::Options;

type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<Vec<u8>>>>>;

/// A `consume` process on a queue of its own, and a client publishing to it and hearing the answers.
pub(crate) struct Consumer {
    child: std::process::Child,
    channel: Channel,
    queue: String,
    replies: String,
    waiting: Waiting,
    _connection: Connection,
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `onceflow consume` on `database_url` and waits until it consumes.
pub(crate) async fn start(amqp_url: &str, database_url: &str) -> anyhow::Result<Consumer> {
    let exe = std::env::current_exe()?.with_file_name("onceflow");
    anyhow::ensure!(exe.exists(), "{} not found: run `cargo build --release --workspace` first", exe.display());
    let queue = format!("onceflow.bench.{}", std::process::id());
    let replies = format!("{queue}.replies");
    let child = std::process::Command::new(exe)
        .args([
            "consume",
            "--database-url",
            database_url,
            "--amqp-url",
            amqp_url,
            "--queue",
            &queue,
            "--channel-url",
            "mock",
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let connection = Connection::connect(amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let options = QueueDeclareOptions { exclusive: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(replies.as_str().into(), options, FieldTable::default()).await?;
    let started = Instant::now();
    loop {
        let probe = connection.create_channel().await?;
        let passive = QueueDeclareOptions::durable().passive();
        if let Ok(q) = probe.queue_declare(queue.as_str().into(), passive, FieldTable::default()).await
            && q.consumer_count() > 0
        {
            break;
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "consume did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waiting: Waiting = Arc::default();
    let no_ack = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
    let mut answers = channel.basic_consume(replies.as_str().into(), "".into(), no_ack, FieldTable::default()).await?;
    let heard = waiting.clone();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = answers.next().await {
            let id = delivery.properties.correlation_id().as_ref().map(|c| c.to_string()).unwrap_or_default();
            let waiter = heard.lock().ok().and_then(|mut w| w.remove(&id));
            if let Some(waiter) = waiter {
                let _ = waiter.send(delivery.data);
            }
        }
    });
    Ok(Consumer { child, channel, queue, replies, waiting, _connection: connection })
}

/// Drives `o.count` commands through the consumer, `o.concurrency` at a time.
pub(crate) async fn run(name: &'static str, consumer: &Consumer, o: &Options) -> anyhow::Result<Run> {
    let (channel, queue, replies, waiting) =
        (consumer.channel.clone(), consumer.queue.clone(), consumer.replies.clone(), consumer.waiting.clone());
    let run = drive(name, o, move |n| {
        let (channel, queue, replies, waiting) = (channel.clone(), queue.clone(), replies.clone(), waiting.clone());
        async move {
            let id = n.to_string();
            let (tx, rx) = oneshot::channel();
            waiting.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.insert(id.clone(), tx);
            let body = serde_json::json!({"order_no": format!("o{n}"), "amount": 1000, "currency": "CNY", "request_no": format!("r{n}")});
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into())
                .with_correlation_id(id.as_str().into())
                .with_reply_to(replies.as_str().into());
            let options = BasicPublishOptions::default();
            let bytes = body.to_string().into_bytes();
            channel.basic_publish("".into(), queue.as_str().into(), options, &bytes, properties).await?.await?;
            let answer: serde_json::Value = serde_json::from_slice(&rx.await?)?;
            anyhow::ensure!(answer["status"] == 201, "command {n}: {answer}");
            Ok(())
        }
    })
    .await?;
    Ok(run)
}

impl Consumer {
    /// Stops the consumer, then deletes its queues (deleted under a live consumer, they would be declared
    /// again by its reconnection).
    pub(crate) async fn finish(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for queue in [self.queue.clone(), format!("{}.dead", self.queue)] {
            let _ = self.channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await;
        }
    }
}
