//! `onceflow consume`: payment commands from a RabbitMQ queue (`contracts/mq.md`).
//!
//! Each delivery is paid as the same payment workflow HTTP starts, identified by the tenant and `request_no`
//! ([`onceflow_payments::Payments::pay_command`]), so a redelivered command attaches to the payment already
//! under way and gets the same answer. The command is acknowledged only after its answer (or, for a bad
//! message, its copy in `<queue>.dead`) was confirmed by the broker: a consumer that dies before leaves it to
//! be delivered again, which is safe. A storage outage returns the command to the queue after a pause. The
//! connection is this module's own loop: on any broker error it drops the session (the broker requeues what
//! was unacknowledged) and connects again with a growing pause, rather than lapin's recovery, which would
//! replay consumers while ackers of the old channel are still in our hands.
//!
//! Hostile producers (issue 35): a bad message's copy keeps its own headers only while they are small (a copy
//! over the broker's frame limit would close the connection, and the message would come back for ever), and a
//! bad message delivered again is rejected to `<queue>.dead` by the broker rather than copied again, so that no
//! message can make the consumer connect again in a loop. Answers go only to the queues `--reply-to-prefix`
//! allows. A delivery is read whole before its size is known; the broker's `max_message_size` is what stops a
//! giant message unread, and a broker that takes messages over the limit is named at start-up.

mod command;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use onceflow_payments::{PaymentStore, Payments};

use crate::config::{ConfigError, ConsumeArgs};
use crate::database::redact;

/// How long a command is held after a storage outage before it goes back to the queue.
const OUTAGE_PAUSE: Duration = Duration::from_secs(1);
/// How long in-flight commands get to finish on shutdown before they are returned to the queue.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// The first and the longest pause between connection attempts.
const RECONNECT_FIRST: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// Longest a connection and its setup (channels, declarations, consume) may take before trying again.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The header naming why a message was dead-lettered (a problem `code`).
const ERROR_HEADER: &str = "x-onceflow-error";
/// The header with the problem's `detail`.
const DETAIL_HEADER: &str = "x-onceflow-detail";
/// The header saying a bad message's own headers were left off its copy, and how large they were.
const DROPPED_HEADER: &str = "x-onceflow-headers-dropped";
/// RabbitMQ's direct reply-to pseudo-queue: an answer goes back to the producer's own channel.
const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// What the consumer is configured with, checked at start-up.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    amqp_url: String,
    queue: String,
    dead: String,
    tenant: String,
    prefetch: u16,
    wait: Duration,
    replies: command::Replies,
}

impl Settings {
    /// The settings of `args`, or what is wrong with them (exit code 2).
    pub(crate) fn from_args(args: &ConsumeArgs) -> Result<Self, ConfigError> {
        args.amqp_url
            .parse::<lapin::uri::AMQPUri>()
            .map_err(|e| ConfigError(format!("--amqp-url `{}`: {e}", redact(&args.amqp_url))))?;
        // `<queue>.dead` must fit in an AMQP short string too.
        if args.queue.is_empty() || args.queue.len() > 250 || args.queue.starts_with("amq.") {
            return Err(ConfigError(format!(
                "--queue must be 1-250 bytes and not start with `amq.` (got `{}`)",
                args.queue
            )));
        }
        if args.tenant.is_empty() {
            return Err(ConfigError("--tenant must not be empty".into()));
        }
        let dead = format!("{}.dead", args.queue);
        let prefixes: Vec<String> = match &args.reply_to_prefix {
            Some(raw) => raw.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect(),
            None => vec![format!("{}.replies", args.queue), DIRECT_REPLY_TO.to_owned()],
        };
        if prefixes.is_empty() {
            return Err(ConfigError("--reply-to-prefix: no prefix given".into()));
        }
        let replies = command::Replies::new(prefixes, [args.queue.clone(), dead.clone()]);
        Ok(Self {
            amqp_url: args.amqp_url.clone(),
            queue: args.queue.clone(),
            dead,
            tenant: args.tenant.clone(),
            prefetch: args.prefetch,
            wait: Duration::from_millis(args.serve.wait_ms),
            replies,
        })
    }
}

/// `/metrics` and `/healthz` of a consumer.
pub(crate) fn metrics_app() -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(|| async { crate::metrics::render() }))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
}

/// Consumes until `stop` is cancelled, connecting again whenever the broker goes away. An error only for
/// what retrying cannot mend (the queue exists with other arguments).
pub(crate) async fn run<S: PaymentStore>(
    payments: Payments<S>,
    settings: Settings,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let cx = Arc::new(Context { payments, settings });
    let mut pause = RECONNECT_FIRST;
    loop {
        match session(&cx, &stop).await {
            Ok(()) => return Ok(()),
            Err(Ended::Fatal(e)) => return Err(e),
            Err(Ended::Lost { error, consumed }) => {
                if consumed {
                    pause = RECONNECT_FIRST;
                }
                let retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
                if consumed {
                    tracing::warn!(%error, retry_in_ms, "broker connection lost");
                } else {
                    tracing::warn!(%error, retry_in_ms, "cannot reach the broker");
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

struct Context<S: PaymentStore> {
    payments: Payments<S>,
    settings: Settings,
}

/// Why a session ended other than by the stop.
enum Ended {
    /// The broker went away or a channel failed: connect again (`consumed`: it had been consuming).
    Lost { error: String, consumed: bool },
    /// Retrying cannot help.
    Fatal(anyhow::Error),
}

impl From<lapin::Error> for Ended {
    fn from(e: lapin::Error) -> Self {
        Self::Lost { error: e.to_string(), consumed: false }
    }
}

/// Whether the broker refused a declaration because the queue exists with other arguments.
fn precondition_failed(e: &lapin::Error) -> bool {
    matches!(e.kind(), ErrorKind::ProtocolError(amqp)
        if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED))
}

/// Declares the command queue (durable, dead-lettering into `<queue>.dead`) and the dead-letter queue.
async fn declare(channel: &Channel, s: &Settings) -> Result<(), Ended> {
    let durable = QueueDeclareOptions::durable();
    let mut arguments = FieldTable::default();
    arguments.insert("x-dead-letter-exchange".into(), AMQPValue::LongString(LongString::from("")));
    arguments.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(LongString::from(s.dead.as_str())));
    for (queue, arguments) in [(&s.dead, FieldTable::default()), (&s.queue, arguments)] {
        if let Err(e) = channel.queue_declare(queue.as_str().into(), durable, arguments).await {
            if precondition_failed(&e) {
                return Err(Ended::Fatal(anyhow::anyhow!(
                    "queue {queue} exists with other arguments than a durable queue dead-lettering into {} \
                     (delete it, or choose another --queue): {e}",
                    s.dead
                )));
            }
            return Err(e.into());
        }
    }
    Ok(())
}

/// One connection: consumes until the stop (then drains and returns `Ok`) or until the broker fails.
async fn session<S: PaymentStore>(cx: &Arc<Context<S>>, stop: &CancellationToken) -> Result<(), Ended> {
    let s = &cx.settings;
    let properties = ConnectionProperties::default().with_connection_name("onceflow consume".into());
    // A broker that is starting may accept the connection and then not answer the handshake: every step of
    // setting up is bounded, so a consumer never waits forever for a broker that came back.
    let setup = async {
        let connection = Connection::connect(&s.amqp_url, properties).await?;
        // Deliveries and their acks on one channel, answers on another with publisher confirms.
        let deliveries = connection.create_channel().await?;
        let publisher = connection.create_channel().await?;
        publisher.confirm_select(ConfirmSelectOptions::default()).await?;
        declare(&deliveries, s).await?;
        check_size_limit(&connection).await?;
        deliveries.basic_qos(s.prefetch, BasicQosOptions::default()).await?;
        let consumer = deliveries
            .basic_consume(s.queue.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
            .await?;
        Ok::<_, Ended>((connection, deliveries, publisher, consumer))
    };
    let (connection, deliveries, publisher, mut consumer) = tokio::select! {
        () = stop.cancelled() => return Ok(()),
        set = tokio::time::timeout(SETUP_TIMEOUT, setup) => match set {
            Ok(set) => set?,
            Err(_) => return Err(Ended::Lost { error: "the broker did not answer the setup in time".into(), consumed: false }),
        },
    };
    tracing::info!(
        amqp_url = %redact(&s.amqp_url), queue = %s.queue, tenant = %s.tenant, prefetch = s.prefetch,
        "consuming"
    );

    // Cancelled by a task whose answer channel failed: the session is of no use any more.
    let broken = CancellationToken::new();
    // Cancelled when the drain's grace is over: commands still in flight go back to the queue.
    let abandon = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let lost = loop {
        tokio::select! {
            () = stop.cancelled() => break None,
            () = broken.cancelled() => break Some("the answer channel failed".to_owned()),
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    let task = Task { cx: cx.clone(), publisher: publisher.clone(), broken: broken.clone() };
                    tasks.spawn(task.handle(delivery, abandon.clone()));
                }
                Some(Err(e)) => break Some(e.to_string()),
                None => break Some("the broker cancelled the consumer".to_owned()),
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    };
    if let Some(error) = lost {
        // Dropping the tasks drops their deliveries: the broker requeues them with the connection.
        drop(tasks);
        let _ = tokio::time::timeout(SETUP_TIMEOUT, connection.close(200, "reconnecting".into())).await;
        return Err(Ended::Lost { error, consumed: true });
    }

    // Stop: take no more, let the ones in flight finish (or return them), give back what was prefetched.
    tracing::info!(in_flight = tasks.len(), "stopping: no more deliveries, finishing the ones in flight");
    let _ = deliveries.basic_cancel(consumer.tag(), BasicCancelOptions::default()).await;
    let drain = async {
        loop {
            tokio::select! {
                next = consumer.next() => match next {
                    Some(Ok(prefetched)) => requeue(&prefetched).await,
                    Some(Err(_)) | None => break,
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        while tasks.join_next().await.is_some() {}
    };
    if tokio::time::timeout(DRAIN_GRACE, drain).await.is_err() {
        abandon.cancel();
        while tasks.join_next().await.is_some() {}
    }
    let _ = deliveries.close(200, "shutting down".into()).await;
    let _ = publisher.close(200, "shutting down".into()).await;
    let _ = connection.close(200, "shutting down".into()).await;
    tracing::info!("consumer stopped");
    Ok(())
}

/// The most of a bad message's detail that its dead-letter copy and the log carry.
const DETAIL_MAX: usize = 256;

/// The most of a bad message's own headers (their AMQP encoding) that its dead-letter copy carries. The broker
/// took the message within its frame limit (`frame_max`, 128 KiB by default), so a copy with the consumer's
/// headers added could exceed it by those few hundred bytes: the broker would close the connection and deliver
/// the message again, for ever. Larger headers are left off (and said so in `x-onceflow-headers-dropped`).
const KEPT_HEADERS_MAX: usize = 16 * 1024;

/// Whether the broker was found to take messages over [`command::MAX_BODY`] (named once per process).
static NAMED_NO_LIMIT: AtomicBool = AtomicBool::new(false);

/// Whether the broker refuses a message over [`command::MAX_BODY`] (RabbitMQ's `max_message_size`): only then is
/// a giant message stopped before the consumer reads it whole — the client library buffers each delivery in full,
/// up to the broker's limit times the prefetch, before the consumer can see its size. Found out with one probe a
/// byte over the limit, on a channel of its own, to the default exchange under a name no queue has (a broker
/// that takes it drops it at once); a broker without a low enough limit is named once, as a warning, and in
/// `onceflow_mq_broker_limits_size`.
async fn check_size_limit(connection: &Connection) -> Result<(), Ended> {
    let probe = connection.create_channel().await?;
    probe.confirm_select(ConfirmSelectOptions::default()).await?;
    let body = vec![b' '; command::MAX_BODY + 1];
    let key = format!("onceflow.size-probe.{}", uuid::Uuid::new_v4().simple());
    let sent = probe
        .basic_publish(
            "".into(),
            key.as_str().into(),
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default(),
        )
        .await;
    let confirmed = match sent {
        Ok(confirm) => confirm.await,
        Err(e) => Err(e),
    };
    let limited = match confirmed {
        Ok(Confirmation::Ack(_)) => false,
        Ok(_) => true,
        Err(e) if precondition_failed(&e) => true,
        // Not worth a session: whatever else failed, the next steps of the setup meet it too if it matters.
        Err(e) => {
            tracing::debug!(error = %e, "could not probe the broker's message size limit");
            return Ok(());
        }
    };
    if !limited {
        let _ = probe.close(200, "probed".into()).await;
        if !NAMED_NO_LIMIT.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limit = command::MAX_BODY,
                "the broker takes messages over the consumer's limit: a giant one is read whole (up to --prefetch of \
                 them at once) before it is refused; set max_message_size = {} in rabbitmq.conf",
                command::MAX_BODY
            );
        }
    }
    metrics::gauge!("onceflow_mq_broker_limits_size").set(if limited { 1.0 } else { 0.0 });
    Ok(())
}

/// How deep the original headers of a bad message may nest and still be kept on its dead-letter copy.
const KEPT_HEADERS_DEPTH: usize = 8;

/// How deep `table` nests (1: no table or array inside), counted only up to `limit + 1`.
fn table_depth(table: &FieldTable, limit: usize) -> usize {
    fn value_depth(value: &AMQPValue, limit: usize) -> usize {
        match value {
            AMQPValue::FieldTable(t) => table_depth(t, limit),
            AMQPValue::FieldArray(a) if limit > 0 => {
                1 + a.as_slice().iter().map(|v| value_depth(v, limit - 1)).max().unwrap_or(0)
            }
            AMQPValue::FieldArray(_) => 1,
            _ => 0,
        }
    }
    if limit == 0 {
        return 1;
    }
    1 + table.inner().values().map(|v| value_depth(v, limit - 1)).max().unwrap_or(0)
}

/// How many bytes `table` takes in AMQP's encoding (its length prefix included).
fn table_len(table: &FieldTable) -> usize {
    4 + table.inner().iter().map(|(key, value)| 1 + key.as_str().len() + value_len(value)).sum::<usize>()
}

/// How many bytes `value` takes in AMQP's encoding (its type byte included).
fn value_len(value: &AMQPValue) -> usize {
    1 + match value {
        AMQPValue::Void => 0,
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::ShortString(s) => 1 + s.as_str().len(),
        AMQPValue::LongString(s) => 4 + s.len(),
        AMQPValue::ByteArray(b) => 4 + b.len(),
        AMQPValue::FieldArray(a) => 4 + a.as_slice().iter().map(value_len).sum::<usize>(),
        AMQPValue::FieldTable(t) => table_len(t),
    }
}

/// The headers of a bad message's dead-letter copy: its own (when they are small, see [`KEPT_HEADERS_MAX`]) and
/// the consumer's, giving the problem's code and (a prefix of) its detail.
fn dead_letter_headers(original: Option<&FieldTable>, detail: &str) -> FieldTable {
    let mut headers = FieldTable::default();
    if let Some(original) = original {
        let size = table_len(original);
        if size <= KEPT_HEADERS_MAX && table_depth(original, KEPT_HEADERS_DEPTH) <= KEPT_HEADERS_DEPTH {
            headers = original.clone();
        } else {
            headers.insert(DROPPED_HEADER.into(), AMQPValue::LongLongInt(i64::try_from(size).unwrap_or(i64::MAX)));
        }
    }
    headers.insert(ERROR_HEADER.into(), AMQPValue::LongString("invalid_request".into()));
    headers.insert(DETAIL_HEADER.into(), AMQPValue::LongString(shortened(detail, DETAIL_MAX).into()));
    headers
}

/// The properties of a bad message's dead-letter copy: what identifies and describes it (content type and
/// encoding, correlation and message id, timestamp, type, app id, reply-to, priority), persistent, with
/// `headers`. Not its `user_id`, which the broker checks against the connection's user (a consumer with a user of
/// its own had the copy refused, its channel closed, and reconnected once per such message), nor its
/// `expiration`, which would let the evidence expire out of the dead-letter queue.
fn dead_letter_properties(original: &BasicProperties, headers: FieldTable) -> BasicProperties {
    let mut copy = BasicProperties::default().with_headers(headers).with_delivery_mode(2);
    type Set = fn(BasicProperties, ShortString) -> BasicProperties;
    let texts: [(&Option<ShortString>, Set); 7] = [
        (original.content_type(), BasicProperties::with_content_type),
        (original.content_encoding(), BasicProperties::with_content_encoding),
        (original.correlation_id(), BasicProperties::with_correlation_id),
        (original.message_id(), BasicProperties::with_message_id),
        (original.kind(), BasicProperties::with_type),
        (original.app_id(), BasicProperties::with_app_id),
        (original.reply_to(), BasicProperties::with_reply_to),
    ];
    for (value, set) in texts {
        if let Some(value) = value {
            copy = set(copy, value.clone());
        }
    }
    if let Some(timestamp) = original.timestamp() {
        copy = copy.with_timestamp(*timestamp);
    }
    if let Some(priority) = original.priority() {
        copy = copy.with_priority(*priority);
    }
    copy
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn shortened(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Returns a delivery to the queue.
async fn requeue(delivery: &Delivery) {
    metrics::counter!("onceflow_mq_commands_total", "outcome" => "requeued").increment(1);
    let _ = delivery.acker.nack(BasicNackOptions { multiple: false, requeue: true }).await;
}

/// Counts a delivery in flight while it lives.
struct InFlight;

impl InFlight {
    fn new() -> Self {
        metrics::gauge!("onceflow_mq_in_flight").increment(1.0);
        Self
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!("onceflow_mq_in_flight").decrement(1.0);
    }
}

/// What one delivery's task holds.
struct Task<S: PaymentStore> {
    cx: Arc<Context<S>>,
    publisher: Channel,
    broken: CancellationToken,
}

/// The `traceparent` header of a message, if it carries one as text.
fn traceparent(delivery: &Delivery) -> Option<String> {
    let headers = delivery.properties.headers().as_ref()?;
    match headers.inner().iter().find(|(k, _)| k.as_str() == "traceparent")?.1 {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

impl<S: PaymentStore> Task<S> {
    /// Handles one delivery to its acknowledgement (or its return to the queue when `abandon` fires first).
    async fn handle(self, delivery: Delivery, abandon: CancellationToken) {
        let _in_flight = InFlight::new();
        // A publisher's W3C trace context in the message's headers: the payment it starts joins that trace.
        let span = tracing::info_span!("message", queue = %self.cx.settings.queue);
        onceflow_engine::trace::adopt(&span, traceparent(&delivery).as_deref());
        tokio::select! {
            () = tracing::Instrument::instrument(self.process(&delivery), span) => {}
            () = abandon.cancelled() => requeue(&delivery).await,
        }
    }

    async fn process(&self, delivery: &Delivery) {
        let s = &self.cx.settings;
        let command = match command::parse(delivery, &s.replies) {
            Ok(command) => command,
            Err(detail) => return self.dead_letter(delivery, &detail).await,
        };
        let request_no = command.request.request_no().map(ToString::to_string).unwrap_or_default();
        let response = match self.cx.payments.pay_command(&s.tenant, &command.request, s.wait).await {
            Ok(response) => response,
            Err(e) => {
                tracing::warn!(%request_no, error = %e, "storage unavailable: the command goes back to the queue");
                tokio::time::sleep(OUTAGE_PAUSE).await;
                return requeue(delivery).await;
            }
        };
        if response.status == 400 {
            return self.dead_letter(delivery, &command::detail_of(&response)).await;
        }
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_correlation_id(command.correlation_id.clone());
        let body = command::answer_bytes(&response);
        match self.publish(command.reply_to.clone(), &body, properties).await {
            Some(Confirmation::Ack(returned)) => {
                if returned.is_some() {
                    // The payment stands and can be read over HTTP; there is no one to tell.
                    tracing::warn!(%request_no, reply_to = %command.reply_to, "no queue takes the answer: dropped");
                }
                if self.ack(delivery).await {
                    let class = match response.status {
                        200..=299 => "2xx",
                        400..=499 => "4xx",
                        _ => "5xx",
                    };
                    metrics::counter!("onceflow_mq_commands_total", "outcome" => class).increment(1);
                    tracing::info!(%request_no, status = response.status, "command answered");
                }
            }
            Some(_) => {
                tracing::warn!(%request_no, "the broker did not take the answer: the command goes back to the queue");
                tokio::time::sleep(OUTAGE_PAUSE).await;
                requeue(delivery).await;
            }
            // The answer channel failed: the session ends, and the broker delivers the command again.
            None => {}
        }
    }

    /// Publishes on the answer channel and waits for the broker's confirm; `None` if the channel failed.
    async fn publish(
        &self,
        routing_key: ShortString,
        body: &[u8],
        properties: BasicProperties,
    ) -> Option<Confirmation> {
        let options = BasicPublishOptions { mandatory: true, immediate: false };
        let published = match self.publisher.basic_publish("".into(), routing_key, options, body, properties).await {
            Ok(confirm) => confirm.await,
            Err(e) => Err(e),
        };
        match published {
            Ok(confirmation) => Some(confirmation),
            Err(e) => {
                tracing::warn!(error = %e, "publishing failed");
                self.broken.cancel();
                None
            }
        }
    }

    /// Acknowledges the delivery; whether the broker had it (a lost channel requeues it instead).
    async fn ack(&self, delivery: &Delivery) -> bool {
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(error = %e, "acknowledging failed: the command will be delivered again");
                false
            }
        }
    }

    /// Moves a bad message to `<queue>.dead` with the problem's code in `x-onceflow-error`: a copy published
    /// there and confirmed, then the original acknowledged. (A plain reject would dead-letter it too, through
    /// the queue's arguments, but cannot add a header; it is the fallback when the copy is refused.)
    ///
    /// A bad message delivered again (its copy, or the acknowledgement after it, was lost with the connection) is
    /// rejected instead, which the broker dead-letters itself (with `x-death`, without the consumer's headers): a
    /// message whose copy cannot be published must not bring the consumer back to it in a loop.
    async fn dead_letter(&self, delivery: &Delivery, detail: &str) {
        let s = &self.cx.settings;
        // The detail may quote the bad input: a short prefix, for the log as for the copy.
        let detail = shortened(detail, DETAIL_MAX);
        if delivery.redelivered {
            tracing::warn!(queue = %s.queue, detail, "bad message delivered again: rejected into the dead-letter queue");
            let rejected = delivery.acker.reject(BasicRejectOptions { requeue: false }).await.is_ok_and(|done| done);
            if rejected {
                metrics::counter!("onceflow_mq_commands_total", "outcome" => "dead_lettered").increment(1);
            }
            return;
        }
        tracing::warn!(queue = %s.queue, detail, "bad message: dead-lettered");
        let headers = dead_letter_headers(delivery.properties.headers().as_ref(), detail);
        let properties = dead_letter_properties(&delivery.properties, headers);
        let moved = match self.publish(s.dead.as_str().into(), &delivery.data, properties).await {
            Some(Confirmation::Ack(None)) => self.ack(delivery).await,
            Some(_) => delivery.acker.reject(BasicRejectOptions { requeue: false }).await.is_ok_and(|done| done),
            None => false,
        };
        if moved {
            metrics::counter!("onceflow_mq_commands_total", "outcome" => "dead_lettered").increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(table: &FieldTable, name: &str) -> Option<AMQPValue> {
        table.inner().get(name).cloned()
    }

    #[test]
    fn a_dead_letter_copy_carries_no_user_id_and_no_expiration() {
        let original = BasicProperties::default()
            .with_user_id("producer".into())
            .with_expiration("60000".into())
            .with_correlation_id("c-1".into())
            .with_content_type("application/json".into())
            .with_delivery_mode(1);
        let copy = dead_letter_properties(&original, FieldTable::default());
        assert_eq!(copy.user_id(), &None);
        assert_eq!(copy.expiration(), &None);
        assert_eq!(copy.correlation_id().as_ref().map(|c| c.as_str()), Some("c-1"));
        assert_eq!(copy.content_type().as_ref().map(|c| c.as_str()), Some("application/json"));
        assert_eq!(copy.delivery_mode(), &Some(2));
    }

    #[test]
    fn a_dead_letter_keeps_small_headers_and_drops_large_ones() {
        let mut small = FieldTable::default();
        small.insert("trace".into(), AMQPValue::LongString("t-1".into()));
        let copy = dead_letter_headers(Some(&small), "invalid body");
        assert_eq!(header(&copy, "trace"), Some(AMQPValue::LongString("t-1".into())));
        assert_eq!(header(&copy, ERROR_HEADER), Some(AMQPValue::LongString("invalid_request".into())));
        assert_eq!(header(&copy, DROPPED_HEADER), None);

        let mut large = FieldTable::default();
        large.insert("pad".into(), AMQPValue::LongString("x".repeat(130_960).into()));
        let copy = dead_letter_headers(Some(&large), &"d".repeat(10_000));
        assert_eq!(header(&copy, "pad"), None);
        assert_eq!(header(&copy, DROPPED_HEADER), Some(AMQPValue::LongLongInt(4 + 1 + 3 + 1 + 4 + 130_960)));
        assert!(table_len(&copy) < 1024, "{}", table_len(&copy));
        assert!(dead_letter_headers(None, "no headers").inner().len() == 2);
    }

    #[test]
    fn table_sizes_count_nested_values() {
        let mut inner = FieldTable::default();
        inner.insert("n".into(), AMQPValue::LongLongInt(1));
        let mut outer = FieldTable::default();
        outer.insert("t".into(), AMQPValue::FieldTable(inner));
        outer.insert("a".into(), AMQPValue::FieldArray(vec![AMQPValue::Boolean(true), AMQPValue::Void].into()));
        // outer: 4 + ("t": 1+1 + table(1 + 4 + 1+1 + 1+8)) + ("a": 1+1 + array(1 + 4 + 2 + 1))
        assert_eq!(table_len(&outer), 4 + (2 + 16) + (2 + 8));
    }
}
