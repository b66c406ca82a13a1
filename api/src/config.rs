//! The command line and its configuration: one typed struct per command, every flag also read from
//! `ONCEFLOW_<FLAG>`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use onceflow_engine::store::{DEFAULT_COMMIT_SLOTS, WorkflowState};
use onceflow_payments::Retention;

/// `onceflow`: durable saga engine and payment service.
#[derive(Debug, Parser)]
#[command(name = "onceflow", version, about = "Durable saga engine and payment service that never charges twice")]
pub struct Cli {
    /// Log format on stderr (`RUST_LOG` filters).
    #[arg(long, env = "ONCEFLOW_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Send traces over OTLP/HTTP to this collector (its base URL, e.g. `http://127.0.0.1:4318`;
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is read too); off when absent.
    #[arg(long, env = "ONCEFLOW_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// For people.
    Text,
    /// One JSON object per line, for machines.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Migrate, then serve the HTTP API and run the recovery loop in the same process.
    Serve(ServeArgs),
    /// Run only the recovery loop (more workers = more processes against one Postgres).
    Worker(ServeArgs),
    /// Apply the migrations and exit.
    Migrate(DatabaseArgs),
    /// One retention pass now (what `serve` and `worker` run every `--gc-interval`), printing what it deleted.
    Gc(GcArgs),
    /// Take payment commands from a RabbitMQ queue (contracts/mq.md), and run the recovery loop.
    Consume(ConsumeArgs),
    /// Serve the mock payment channel.
    MockChannel(MockChannelArgs),
    /// Inspect and steer workflows.
    #[command(subcommand)]
    Workflows(WorkflowsCommand),
    /// Read the event log, send an event again.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Match a day's channel statement against payments and refunds; print the counts per class and the
    /// exceptions (exit 0: exceptions are findings, not failures).
    Reconcile(ReconcileArgs),
}

/// Where the database is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// `postgres://…`, `mysql://…` (MySQL 8 / MariaDB 10.6+) or `sqlite://…` (created if missing).
    #[arg(long, env = "ONCEFLOW_DATABASE_URL", default_value = "sqlite://onceflow.db")]
    pub database_url: String,
}

/// How long what is kept, is kept; orders and payment records are kept for good.
#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// An unused token expires this long after it was issued, and is then deleted.
    #[arg(long, env = "ONCEFLOW_TOKEN_TTL", default_value = "24h", value_parser = parse_duration)]
    pub token_ttl: Duration,
    /// A used token and its stored response are kept this long after the payment ended, then deleted (a
    /// replay after that is `404 token_not_found`).
    #[arg(long, env = "ONCEFLOW_RESPONSE_RETENTION", default_value = "7d", value_parser = parse_duration)]
    pub response_retention: Duration,
    /// A finished workflow (completed, failed, cancelled) and its steps are kept this long after it ended, then
    /// deleted; a compensation_failed one waits for an operator and is kept.
    #[arg(long, env = "ONCEFLOW_HISTORY_RETENTION", default_value = "30d", value_parser = parse_duration)]
    pub history_retention: Duration,
}

impl RetentionArgs {
    /// As the payment service takes it.
    pub fn retention(&self) -> Retention {
        Retention {
            token_ttl: self.token_ttl,
            response_retention: self.response_retention,
            history_retention: self.history_retention,
        }
    }
}

/// `gc`: the database and what to keep.
#[derive(Debug, Clone, Args)]
pub struct GcArgs {
    /// The database.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// What to keep.
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// How long events are kept (and the other event settings, unused here).
    #[command(flatten)]
    pub events: EventArgs,
    /// Count what would be deleted; delete nothing. From the environment: `1`, `true`, `yes` or `on` (`0`,
    /// `false`, `no`, `off`: a real pass).
    #[arg(long, env = "ONCEFLOW_DRY_RUN", value_parser = clap::builder::BoolishValueParser::new())]
    pub dry_run: bool,
}

/// `serve` and `worker`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The database.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// HTTP address to listen on.
    #[arg(long, env = "ONCEFLOW_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Base URL of a channel speaking contracts/channel.md, or `mock` for an in-process mock channel that approves
    /// every charge. Without it only the zero-configuration mode (SQLite, no API keys) uses the mock; anything else
    /// refuses to start.
    #[arg(long, env = "ONCEFLOW_CHANNEL_URL")]
    pub channel_url: Option<String>,
    /// Per-request timeout to the channel.
    #[arg(long, env = "ONCEFLOW_CHANNEL_TIMEOUT_MS", default_value_t = 5000)]
    pub channel_timeout_ms: u64,
    /// `tenant:key,tenant:key`; none: single tenant `default`, no auth, loopback only.
    #[arg(long, env = "ONCEFLOW_API_KEYS")]
    pub api_keys: Option<String>,
    /// `name:key,name:key`: keys that inspect and steer every tenant's workflows (list, show, retry, cancel) and
    /// read `/metrics`; they take no tenant's part (orders, tokens, payments answer them `403`). Needs
    /// `--api-keys`.
    #[arg(long, env = "ONCEFLOW_OPERATOR_KEYS")]
    pub operator_keys: Option<String>,
    /// How long a claimed workflow is owned without a heartbeat.
    #[arg(long, env = "ONCEFLOW_LEASE_MS", default_value_t = 10_000)]
    pub lease_ms: u64,
    /// How long `POST /v1/payments` waits for a final result before `202`.
    #[arg(long, env = "ONCEFLOW_WAIT_MS", default_value_t = 10_000)]
    pub wait_ms: u64,
    /// A payment whose charge outcome is still unknown (or `processing`) this long is logged once as a warning by
    /// each process; it is never auto-failed. Written `500ms`, `30s`, `15m`, `24h`, `7d`.
    #[arg(long, env = "ONCEFLOW_UNRESOLVED_WARN", default_value = "15m", value_parser = parse_duration)]
    pub unresolved_warn: Duration,
    /// Postgres or MySQL connections this process may open (mind `max_connections` across processes; SQLite
    /// uses 8 for reads, 2 for writes).
    #[arg(long, env = "ONCEFLOW_DB_MAX_CONNECTIONS", default_value_t = 20, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub db_max_connections: u32,
    /// Postgres: with `N` > 0, at most `N` commits hold a slot to the database at once; a commit that finds them
    /// all busy waits for the first to end (or give its slot back) and goes with the other waiting commits (up to
    /// 32) in one call and one transaction (group commit: one round trip, one commit, one WAL flush for many
    /// payments; a lone commit never waits). A commit that has held its slot 50 ms (waiting for a row lock, say),
    /// and a batch's member that waits for a row lock, go on without one. `2` by default (docs/benchmarks.md); `0` sends every commit on its
    /// own as soon as it is made.
    #[arg(long, env = "ONCEFLOW_COMMIT_SLOTS", default_value_t = DEFAULT_COMMIT_SLOTS as u16, value_parser = clap::value_parser!(u16).range(0..=1000))]
    pub commit_slots: u16,
    /// How long a client has to send a request's headers (and an idle connection waits for its next request)
    /// before the connection is closed: a slow client cannot hold a connection for ever.
    #[arg(long, env = "ONCEFLOW_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// How long a client has to send a request's body once its headers are in, before it is answered `408` and
    /// the connection is closed: a client that trickles its body cannot hold a connection either.
    #[arg(long, env = "ONCEFLOW_BODY_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub body_read_timeout: Duration,
    /// HTTP connections served at once. At the limit a new connection takes the place of the one that has been
    /// idle or reading a request the longest; only while every connection is answering a request does it wait.
    #[arg(long, env = "ONCEFLOW_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// Largest request head (request line and headers), in bytes; a larger one is answered `431` and its
    /// connection closed. Bounds what each connection buffers before a request is known.
    #[arg(long, env = "ONCEFLOW_MAX_HEADER_BYTES", default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(8192..=16_777_216))]
    pub max_header_bytes: u32,
    /// What to keep, and for how long.
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// How often `serve` and `worker` run a retention pass (one process at a time; the first at start-up).
    #[arg(long, env = "ONCEFLOW_GC_INTERVAL", default_value = "1h", value_parser = parse_duration)]
    pub gc_interval: Duration,
    /// Merchant events and webhooks.
    #[command(flatten)]
    pub events: EventArgs,
    /// The channel's word: where it reaches this service, its notification secrets, the tenants' merchant ids,
    /// and when the day is reconciled.
    #[command(flatten)]
    pub channel_word: ChannelWordArgs,
}

/// Merchant events and their webhooks (contracts/events.md).
#[derive(Debug, Clone, Args)]
pub struct EventArgs {
    /// Events and their delivery records are kept this long (an event with a delivery pending, until it is
    /// delivered or failed).
    #[arg(long, env = "ONCEFLOW_EVENT_RETENTION", default_value = "30d", value_parser = parse_duration)]
    pub event_retention: Duration,
    /// Let webhook endpoints use plain `http` (a local receiver needs this and --webhook-allow-private). From the
    /// environment: `1`, `true`, `yes` or `on`.
    #[arg(long, env = "ONCEFLOW_WEBHOOK_ALLOW_HTTP", value_parser = clap::builder::BoolishValueParser::new())]
    pub webhook_allow_http: bool,
    /// Let webhook endpoints be private, loopback or link-local addresses (refused otherwise, at registration and
    /// at every connection).
    #[arg(long, env = "ONCEFLOW_WEBHOOK_ALLOW_PRIVATE", value_parser = clap::builder::BoolishValueParser::new())]
    pub webhook_allow_private: bool,
    /// The waits between a failed delivery's attempts; its length is the number of retries.
    #[arg(long, env = "ONCEFLOW_WEBHOOK_RETRY_SCHEDULE", default_value = "5s,5m,30m,2h,5h,10h,10h", value_parser = parse_schedule)]
    pub webhook_retry_schedule: Schedule,
    /// An attempt not answered `2xx` within this has failed.
    #[arg(long, env = "ONCEFLOW_WEBHOOK_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub webhook_timeout: Duration,
}

impl EventArgs {
    /// As the payment service takes them.
    pub fn settings(&self) -> onceflow_payments::EventSettings {
        onceflow_payments::EventSettings {
            retention: self.event_retention,
            rules: onceflow_payments::events::address::Rules {
                allow_http: self.webhook_allow_http,
                allow_private: self.webhook_allow_private,
            },
            schedule: self.webhook_retry_schedule.0.clone(),
            timeout: self.webhook_timeout.max(Duration::from_millis(100)),
            ..onceflow_payments::EventSettings::default()
        }
    }
}

/// A retry schedule: durations, comma-separated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule(pub Vec<Duration>);

/// Parses `--webhook-retry-schedule` (`200ms,500ms,1s`; empty: no retries).
pub fn parse_schedule(raw: &str) -> Result<Schedule, String> {
    raw.split(',').map(str::trim).filter(|s| !s.is_empty()).map(parse_duration).collect::<Result<_, _>>().map(Schedule)
}

/// `events …`.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// The event log in commit order, from a cursor.
    List {
        /// The database.
        #[command(flatten)]
        database: DatabaseArgs,
        /// Only this tenant's events.
        #[arg(long, env = "ONCEFLOW_TENANT")]
        tenant: Option<String>,
        /// Start after this cursor (the `next` printed last time).
        #[arg(long, env = "ONCEFLOW_AFTER")]
        after: Option<String>,
        /// How many.
        #[arg(long, env = "ONCEFLOW_LIMIT", default_value_t = 100)]
        limit: i64,
    },
    /// Send an event again now, with the same id (a running `serve` or `worker` sends it).
    Redeliver {
        /// The database.
        #[command(flatten)]
        database: DatabaseArgs,
        /// The event settings: the redelivery keeps `--webhook-retry-schedule` as its own schedule (give the
        /// serving processes' flags).
        #[command(flatten)]
        events: EventArgs,
        /// Only to this endpoint (we_…); else to every endpoint subscribed to the event.
        #[arg(long, env = "ONCEFLOW_ENDPOINT")]
        endpoint: Option<String>,
        /// Why (at most 500 characters, no control characters but line breaks and tabs): kept in the audit log
        /// with the redelivery, as `cli:<user>`'s.
        #[arg(long, env = "ONCEFLOW_REASON", value_parser = parse_reason)]
        reason: Option<String>,
        /// The event (evt_…).
        event_id: String,
    },
}

/// The channel's notifications and statements (`contracts/cli.md`).
#[derive(Debug, Clone, Args)]
pub struct ChannelWordArgs {
    /// The URL at which the channel reaches this service: charges and refunds then carry
    /// `notify_url = <public-url>/v1/channel/notifications`.
    #[arg(long, env = "ONCEFLOW_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// `merchant:secret,…`: the secrets the channel signs notifications with, per channel merchant id (a
    /// merchant named twice: both are accepted, for a rotation).
    #[arg(long, env = "ONCEFLOW_CHANNEL_NOTIFY_SECRETS")]
    pub channel_notify_secrets: Option<String>,
    /// `tenant:merchant_id,…`: each tenant's channel merchant id (by default the tenant's name).
    #[arg(long, env = "ONCEFLOW_CHANNEL_MERCHANTS")]
    pub channel_merchants: Option<String>,
    /// `serve` and `worker` reconcile the previous UTC day once a day at this UTC time (`HH:MM`), one process at
    /// a time, and the days still partial again, hourly, until they are complete.
    #[arg(long, env = "ONCEFLOW_RECONCILE_AT", default_value = "09:30", value_parser = parse_time_of_day)]
    pub reconcile_at: chrono::NaiveTime,
}

impl ChannelWordArgs {
    /// The merchants and their secrets, as the service takes them.
    pub fn accounts(&self) -> Result<onceflow_payments::ChannelAccounts, ConfigError> {
        let merchants = match &self.channel_merchants {
            Some(raw) => parse_pairs(raw, ':', "--channel-merchants", "tenant:merchant_id")?,
            None => Vec::new(),
        };
        let secrets = match &self.channel_notify_secrets {
            Some(raw) => parse_pairs(raw, ':', "--channel-notify-secrets", "merchant:secret")?,
            None => Vec::new(),
        };
        Ok(onceflow_payments::ChannelAccounts::new(merchants, secrets))
    }

    /// `<public-url>/v1/channel/notifications`, when `--public-url` is set.
    pub fn notify_url(&self) -> Result<Option<String>, ConfigError> {
        let Some(url) = &self.public_url else { return Ok(None) };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConfigError(format!("--public-url must be an http(s) URL (got `{url}`)")));
        }
        Ok(Some(format!("{}/v1/channel/notifications", url.trim_end_matches('/'))))
    }
}

/// `reconcile`: the day, whose, and where the statements and records are.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// The database.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The UTC day, `YYYY-MM-DD`.
    #[arg(long, env = "ONCEFLOW_DATE")]
    pub date: chrono::NaiveDate,
    /// Only this tenant (by default every tenant of `--channel-merchants`, or of `--api-keys`, or `default`).
    #[arg(long, env = "ONCEFLOW_TENANT")]
    pub tenant: Option<String>,
    /// Base URL of the channel whose statements are read, or `mock` for an in-process mock (with nothing in it).
    #[arg(long, env = "ONCEFLOW_CHANNEL_URL")]
    pub channel_url: String,
    /// `tenant:merchant_id,…`: each tenant's channel merchant id (by default the tenant's name).
    #[arg(long, env = "ONCEFLOW_CHANNEL_MERCHANTS")]
    pub channel_merchants: Option<String>,
    /// `tenant:key,…`: read only for the tenants' names (the tenants reconciled when neither `--tenant` nor
    /// `--channel-merchants` says).
    #[arg(long, env = "ONCEFLOW_API_KEYS")]
    pub api_keys: Option<String>,
}

/// Parses a UTC time of day written `HH:MM`.
pub fn parse_time_of_day(raw: &str) -> Result<chrono::NaiveTime, String> {
    chrono::NaiveTime::parse_from_str(raw, "%H:%M").map_err(|_| format!("`{raw}` is not a time like 09:30 (UTC)"))
}

/// Parses `a<sep>b,a<sep>b` into pairs (both sides non-empty); `flag` and `shape` name them in the error.
pub fn parse_pairs(raw: &str, sep: char, flag: &str, shape: &str) -> Result<Vec<(String, String)>, ConfigError> {
    raw.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|pair| match pair.trim().split_once(sep) {
            Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
            // The pair itself is not echoed: it may be a secret.
            _ => Err(ConfigError(format!("{flag}: each entry must be {shape}"))),
        })
        .collect()
}

/// `consume`: the database, channel and lease flags of `serve` (its `--listen` and `--api-keys` are not
/// used), plus the broker's.
#[derive(Debug, Clone, Args)]
pub struct ConsumeArgs {
    /// The flags shared with `serve`.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// The broker (AMQP 0-9-1).
    #[arg(long, env = "ONCEFLOW_AMQP_URL", default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,
    /// The command queue, declared durable with a dead-letter queue `<queue>.dead`.
    #[arg(long, env = "ONCEFLOW_QUEUE", default_value = "onceflow.payments")]
    pub queue: String,
    /// The tenant whose payments this queue carries.
    #[arg(long, env = "ONCEFLOW_TENANT", default_value = "default")]
    pub tenant: String,
    /// Unacknowledged commands in flight (basic.qos).
    #[arg(long, env = "ONCEFLOW_PREFETCH", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub prefetch: u16,
    /// HTTP address for `/metrics` and `/healthz`; none: not served.
    #[arg(long, env = "ONCEFLOW_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// `prefix,prefix`: the queues answers may go to, by the start of their name; a command whose `reply_to`
    /// names another queue is a bad message, never paid (a producer must not make the consumer write into a
    /// queue it chose, another tenant's command queue say). Default: `<queue>.replies` and RabbitMQ's direct
    /// reply-to (`amq.rabbitmq.reply-to`).
    #[arg(long, env = "ONCEFLOW_REPLY_TO_PREFIX")]
    pub reply_to_prefix: Option<String>,
}

/// `mock-channel`: rates are 0.0–1.0.
#[derive(Debug, Clone, Args)]
pub struct MockChannelArgs {
    /// HTTP address to listen on.
    #[arg(long, env = "ONCEFLOW_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// Delay before every reply.
    #[arg(long, env = "ONCEFLOW_LATENCY_MS", default_value_t = 0)]
    pub latency_ms: u64,
    /// Share of charges declined.
    #[arg(long, env = "ONCEFLOW_DECLINE_RATE", default_value_t = 0.0)]
    pub decline_rate: f64,
    /// Share of charge requests answered 500 before charging.
    #[arg(long, env = "ONCEFLOW_ERROR_BEFORE_RATE", default_value_t = 0.0)]
    pub error_before_rate: f64,
    /// Share of charge requests that charge, then answer 500 (reply lost).
    #[arg(long, env = "ONCEFLOW_ERROR_AFTER_RATE", default_value_t = 0.0)]
    pub error_after_rate: f64,
    /// Share of charge requests answered after the client's timeout.
    #[arg(long, env = "ONCEFLOW_SLOW_RATE", default_value_t = 0.0)]
    pub slow_rate: f64,
    /// How late a slow reply comes.
    #[arg(long, env = "ONCEFLOW_SLOW_MS", default_value_t = 10_000)]
    pub slow_ms: u64,
    /// Share of charges that stay processing for `--settle-ms`.
    #[arg(long, env = "ONCEFLOW_PROCESSING_RATE", default_value_t = 0.0)]
    pub processing_rate: f64,
    /// How long a processing charge takes to settle.
    #[arg(long, env = "ONCEFLOW_SETTLE_MS", default_value_t = 1_000)]
    pub settle_ms: u64,
    /// How long a new charge request is held before the channel records it (a charge in flight).
    #[arg(long, env = "ONCEFLOW_HOLD_MS", default_value_t = 0)]
    pub hold_ms: u64,
    /// Share of new refunds that end failed (nothing refunded).
    #[arg(long, env = "ONCEFLOW_REFUND_FAIL_RATE", default_value_t = 0.0)]
    pub refund_fail_rate: f64,
    /// Share of new refunds that stay processing for `--settle-ms`.
    #[arg(long, env = "ONCEFLOW_REFUND_PROCESSING_RATE", default_value_t = 0.0)]
    pub refund_processing_rate: f64,
    /// Share of refund requests answered 500 after the refund was recorded (reply lost).
    #[arg(long, env = "ONCEFLOW_REFUND_ERROR_AFTER_RATE", default_value_t = 0.0)]
    pub refund_error_after_rate: f64,
    /// Seed of the fault dice.
    #[arg(long, env = "ONCEFLOW_SEED", default_value_t = 1)]
    pub seed: u64,
    /// `merchant=secret`, repeatable (or comma-separated in the environment): sign the notifications sent to a
    /// request's `notify_url` with this secret (a merchant named twice: signed with both, as in a rotation).
    #[arg(long, env = "ONCEFLOW_NOTIFY_SECRET", value_delimiter = ',')]
    pub notify_secret: Vec<String>,
    /// The waits between a notification's attempts, e.g. `200ms,1s,5s` (by default the contract's 15 s, 1 min,
    /// 5 min, 30 min, 2 h, 6 h, then every 6 h for 24 h).
    #[arg(long, env = "ONCEFLOW_NOTIFY_SCHEDULE", value_delimiter = ',', value_parser = parse_duration)]
    pub notify_schedule: Vec<Duration>,
}

/// `workflows …`.
#[derive(Debug, Subcommand)]
pub enum WorkflowsCommand {
    /// The newest workflows, optionally in one state.
    List {
        /// The database.
        #[command(flatten)]
        database: DatabaseArgs,
        /// running, compensating, completed, failed, compensation_failed or cancelled.
        #[arg(long, env = "ONCEFLOW_STATE")]
        state: Option<WorkflowState>,
        /// Only this tenant's workflows.
        #[arg(long, env = "ONCEFLOW_TENANT")]
        tenant: Option<String>,
        /// How many.
        #[arg(long, env = "ONCEFLOW_LIMIT", default_value_t = 20)]
        limit: i64,
    },
    /// One workflow with its steps.
    Show {
        /// The database.
        #[command(flatten)]
        database: DatabaseArgs,
        /// The workflow id.
        workflow_id: String,
    },
    /// Retry a workflow that ended failed or compensation_failed.
    Retry {
        /// The database.
        #[command(flatten)]
        database: DatabaseArgs,
        /// The workflow id.
        workflow_id: String,
        /// Why (at most 500 characters, no control characters but line breaks and tabs): kept in the audit log
        /// with the action, as `cli:<user>`'s.
        #[arg(long, env = "ONCEFLOW_REASON", value_parser = parse_reason)]
        reason: Option<String>,
    },
    /// Cancel a running workflow: its compensations run.
    Cancel {
        /// The database.
        #[command(flatten)]
        database: DatabaseArgs,
        /// The workflow id.
        workflow_id: String,
        /// Why (at most 500 characters, no control characters but line breaks and tabs): kept in the audit log
        /// with the action, as `cli:<user>`'s.
        #[arg(long, env = "ONCEFLOW_REASON", value_parser = parse_reason)]
        reason: Option<String>,
    },
}

/// A configuration error: reported in one line, exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Parses a duration written `500ms`, `30s`, `15m`, `24h` or `7d` (units may be combined: `1h 30m`).
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw).map_err(|e| format!("`{raw}` is not a duration like 500ms, 30s, 15m, 24h, 7d: {e}"))
}

/// Checks `--reason` as the HTTP API checks an action's reason: at most 500 characters, no control character
/// but line breaks and tabs (a longer one was cut short silently).
pub fn parse_reason(raw: &str) -> Result<String, String> {
    if raw.chars().count() > crate::routes::audit::MAX_REASON {
        return Err(format!("a reason is at most {} characters", crate::routes::audit::MAX_REASON));
    }
    crate::text::reason(raw).map(str::to_owned).map_err(|e| e.detail)
}

/// Parses `--api-keys` (`tenant:key,tenant:key`) into `(tenant, key)` pairs.
pub fn parse_api_keys(raw: &str) -> Result<Vec<(String, String)>, ConfigError> {
    raw.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|pair| {
            let (tenant, key) = pair
                .trim()
                .split_once(':')
                .ok_or_else(|| ConfigError(format!("--api-keys: `{pair}` is not tenant:key")))?;
            if tenant.chars().any(char::is_control) {
                return Err(ConfigError(format!(
                    "--api-keys: the name `{}` holds a control character",
                    tenant.escape_debug()
                )));
            }
            if tenant.is_empty() || key.len() < 8 {
                return Err(ConfigError(format!(
                    "--api-keys: `{tenant}` needs a tenant name and a key of at least 8 characters"
                )));
            }
            Ok((tenant.to_owned(), key.to_owned()))
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|keys| {
            if keys.is_empty() { Err(ConfigError("--api-keys: no tenant:key pair given".into())) } else { Ok(keys) }
        })
        .and_then(|keys| one_owner_per_key(keys, "--api-keys"))
}

/// `keys`, unless one key is given to more than one name: a request with it could not say whose it is (the
/// last one named won: one tenant's orders were stored as another's). The same name may hold several keys
/// (rotation), and a pair given twice is one.
fn one_owner_per_key(keys: Vec<(String, String)>, flag: &str) -> Result<Vec<(String, String)>, ConfigError> {
    for (i, (name, key)) in keys.iter().enumerate() {
        if let Some((other, _)) = keys[..i].iter().find(|(other, k)| k == key && other != name) {
            return Err(ConfigError(format!(
                "{flag}: one key is given to more than one name (`{other}` and `{name}`)"
            )));
        }
    }
    Ok(keys)
}

/// Parses `--operator-keys` (`name:key,name:key`) into `(name, key)` pairs; a key that is also a tenant's (one
/// of `tenants`) is refused, since a request could not say which it is.
pub fn parse_operator_keys(raw: &str, tenants: &[(String, String)]) -> Result<Vec<(String, String)>, ConfigError> {
    let keys = parse_api_keys(raw).map_err(|e| ConfigError(e.0.replace("--api-keys", "--operator-keys")))?;
    if let Some((name, _)) = keys.iter().find(|(_, key)| tenants.iter().any(|(_, t)| t == key)) {
        return Err(ConfigError(format!("--operator-keys: the key of `{name}` is also a tenant's key in --api-keys")));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_checked_as_over_http() {
        assert_eq!(parse_reason("customer called\nagain").as_deref(), Ok("customer called\nagain"));
        assert!(parse_reason(&"x".repeat(501)).is_err(), "refused, not cut short");
        assert!(parse_reason("nul\0").is_err());
        assert!(parse_reason("\u{1b}[2J").is_err());
        assert!(parse_api_keys("acme\u{7}:acme-secret-key").is_err());
        assert!(parse_operator_keys("ops\u{1b}[31m:operator-key", &[]).is_err());
    }

    /// contracts/cli.md: every flag also reads `ONCEFLOW_` + its name in upper case, `-` as `_`.
    #[test]
    fn every_flag_reads_its_environment_variable() {
        fn check(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if matches!(long, "help" | "version") {
                    continue;
                }
                let expected = format!("ONCEFLOW_{}", long.to_uppercase().replace('-', "_"));
                if arg.get_env() != Some(std::ffi::OsStr::new(&expected)) {
                    missing.push(format!("{path} --{long}: {:?}, not {expected}", arg.get_env()));
                }
            }
            for sub in command.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        check(&<Cli as clap::CommandFactory>::command(), "onceflow", &mut missing);
        assert!(missing.is_empty(), "{missing:#?}");
    }

    #[test]
    fn durations_parse_in_the_written_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("15").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn api_keys_parse_and_reject_bad_lists() {
        let keys = parse_api_keys("acme:secret-key-1,globex:secret-key-2").unwrap();
        assert_eq!(keys[1], ("globex".to_owned(), "secret-key-2".to_owned()));
        assert!(parse_api_keys("acme").is_err());
        assert!(parse_api_keys("acme:short").is_err());
        assert!(parse_api_keys(",").is_err());
        let shared = parse_api_keys("t1:shared-key-1,t2:shared-key-1").unwrap_err().0;
        assert!(shared.contains("more than one") && shared.contains("t1") && shared.contains("t2"), "{shared}");
        // A tenant with two keys (rotation), a pair given twice: fine.
        assert_eq!(parse_api_keys("t1:old-key-01,t1:new-key-01,t1:new-key-01").unwrap().len(), 3);
    }

    #[test]
    fn operator_keys_parse_and_are_not_tenant_keys() {
        let tenants = parse_api_keys("acme:secret-key-1").unwrap();
        let ops = parse_operator_keys("ops:operator-key-1", &tenants).unwrap();
        assert_eq!(ops, [("ops".to_owned(), "operator-key-1".to_owned())]);
        assert!(parse_operator_keys("ops:secret-key-1", &tenants).unwrap_err().0.contains("also a tenant's"));
        assert!(parse_operator_keys("ops:short", &tenants).unwrap_err().0.starts_with("--operator-keys"));
        let shared = parse_operator_keys("ops1:operator-key,ops2:operator-key", &tenants).unwrap_err().0;
        assert!(shared.starts_with("--operator-keys") && shared.contains("more than one"), "{shared}");
    }
}
