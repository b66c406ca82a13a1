//! Running the commands: what `main` calls after parsing.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::EngineConfig;
use onceflow_payments::{
    Channel, HttpChannel, MockChannel, MockChannelConfig, PaymentStore, Payments, RequestNo, mock_channel_router,
};

use crate::config::{
    Command, ConfigError, DatabaseArgs, GcArgs, MockChannelArgs, ServeArgs, WorkflowsCommand, parse_api_keys,
    parse_operator_keys,
};
use crate::database::{OnPayments, Pool, redact, with_payments, with_payments_on};
use crate::state::{AppState, Auth};

/// How long in-flight workflows get to reach a step boundary on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs one command to its end. Exit codes: 0 success, 2 bad usage or configuration, 1 other failure.
pub async fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::Serve(args) => serve(args, true).await,
        Command::Worker(args) => serve(args, false).await,
        Command::Migrate(db) => migrate(db).await,
        Command::Gc(args) => gc(args).await,
        Command::Consume(args) => consume(args).await,
        Command::MockChannel(args) => mock_channel(args).await,
        Command::Workflows(cmd) => workflows(cmd).await,
        Command::Events(cmd) => crate::events::run(cmd).await.map_err(Failure::from_events),
        Command::Reconcile(args) => crate::reconcile::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) enum Failure {
    Config(ConfigError),
    Other(anyhow::Error),
}

impl Failure {
    /// An `events` command's failure.
    fn from_events(e: crate::events::CommandError) -> Self {
        match e {
            crate::events::CommandError::Config(e) => Self::Config(e),
            crate::events::CommandError::Other(e) => Self::Other(e),
        }
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Self::Other(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::Other(e.into())
    }
}

/// What `/readyz` and the start-up warning say of the in-process mock channel.
pub(crate) const MOCK_WARNING: &str =
    "payments are charged to the in-process mock channel: every charge succeeds and no money moves";

/// Says loudly, once the service is up, that a deployment with API keys or a server database charges the
/// in-process mock (asked for by name): every payment would "succeed" with no money taken.
fn warn_of_a_pretend_channel(args: &ServeArgs) {
    if args.channel_url.as_deref() == Some("mock")
        && (args.api_keys.is_some() || !args.database.database_url.starts_with("sqlite:"))
    {
        tracing::warn!(
            "--channel-url mock with API keys or a server database: {MOCK_WARNING}; give the channel's URL for real \
             payments"
        );
    }
}

/// Whether `args` charge the in-process mock channel.
fn charges_the_mock(args: &ServeArgs) -> bool {
    match args.channel_url.as_deref() {
        Some(url) => url == "mock",
        None => args.database.database_url.starts_with("sqlite:") && args.api_keys.is_none(),
    }
}

/// The channel `serve` and `worker` charge: the URL given, or the in-process mock, which approves every charge.
/// The mock is used when asked for by name (`--channel-url mock`) or, without `--channel-url`, only in the
/// zero-configuration mode (an SQLite database and no API keys); a Postgres or MySQL database or API keys mean a
/// real deployment, which refuses to start rather than charge a pretend channel — and which, given the mock by
/// name, says so loudly (every payment would "succeed" with no money taken).
fn channel(args: &ServeArgs) -> Result<Arc<dyn Channel>, ConfigError> {
    match args.channel_url.as_deref() {
        Some("mock") => Ok(Arc::new(MockChannel::reliable())),
        Some(url) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError(format!(
                    "--channel-url must be an http(s) URL or `mock` for the in-process mock (got `{url}`)"
                )));
            }
            Ok(Arc::new(
                HttpChannel::new(url, Duration::from_millis(args.channel_timeout_ms))
                    .map_err(|e| ConfigError(e.to_string()))?,
            ))
        }
        None if args.database.database_url.starts_with("sqlite:") && args.api_keys.is_none() => {
            tracing::info!("no --channel-url: charging the in-process mock channel, which approves every charge");
            Ok(Arc::new(MockChannel::reliable()))
        }
        None => Err(ConfigError(
            "no --channel-url: a Postgres or MySQL database or --api-keys is a real deployment; give the channel's \
             URL, or `--channel-url mock` for the in-process mock that approves every charge"
                .into(),
        )),
    }
}

/// The channel, its charges and refunds carrying `notify_url` when `--public-url` is set.
fn notifying_channel(args: &ServeArgs) -> Result<Arc<dyn Channel>, ConfigError> {
    let channel = channel(args)?;
    Ok(match args.channel_word.notify_url()? {
        Some(url) => onceflow_payments::with_notify_url(channel, url),
        None => channel,
    })
}

/// Runs `task` on the payment service `serve`, `worker` and `consume` configure: their database, channel and
/// lease.
async fn with_service<T: OnPayments>(args: &ServeArgs, task: T) -> Result<T::Output, ConfigError> {
    with_service_on(args, notifying_channel(args)?, task).await
}

/// [`with_service`] charging `channel`.
async fn with_service_on<T: OnPayments>(
    args: &ServeArgs,
    channel: Arc<dyn Channel>,
    task: T,
) -> Result<T::Output, ConfigError> {
    let config = EngineConfig { lease: Duration::from_millis(args.lease_ms.max(100)), ..EngineConfig::default() };
    let pool = Pool { connections: args.db_max_connections, commit_slots: usize::from(args.commit_slots) };
    with_payments_on(&args.database.database_url, channel, config, pool, task).await
}

/// Runs `task` on the service over the database of an operator command (which charges nothing).
async fn with_database<T: OnPayments>(db: &DatabaseArgs, task: T) -> Result<T::Output, ConfigError> {
    with_payments(&db.database_url, Arc::new(MockChannel::reliable()), EngineConfig::default(), 2, task).await
}

async fn serve(args: ServeArgs, http: bool) -> Result<(), Failure> {
    let auth = match (&args.api_keys, &args.operator_keys) {
        (Some(raw), None) => Auth::keys(parse_api_keys(raw)?),
        (Some(raw), Some(operators)) => {
            let tenants = parse_api_keys(raw)?;
            let operators = parse_operator_keys(operators, &tenants)?;
            Auth::keys(tenants).with_operators(operators)
        }
        (None, None) => Auth::SingleTenant,
        // Without tenant keys the service would have no tenant: the zero-configuration mode has no keys at all.
        (None, Some(_)) => return Err(ConfigError("--operator-keys needs --api-keys".into()).into()),
    };
    if http && matches!(auth, Auth::SingleTenant) && !args.listen.ip().is_loopback() {
        return Err(ConfigError(format!(
            "--listen {} is not a loopback address: configure --api-keys to serve other hosts",
            args.listen
        ))
        .into());
    }
    let accounts = args.channel_word.accounts()?;
    let mut tenants = match &args.api_keys {
        Some(raw) => parse_api_keys(raw)?.into_iter().map(|(tenant, _)| tenant).collect(),
        None => vec![crate::state::DEFAULT_TENANT.to_owned()],
    };
    if let Some(raw) = &args.channel_word.channel_merchants {
        let mapped = crate::config::parse_pairs(raw, ':', "--channel-merchants", "tenant:merchant_id")?;
        tenants.extend(mapped.into_iter().map(|(tenant, _)| tenant));
    }
    tenants.sort();
    tenants.dedup();
    let channel = notifying_channel(&args)?;
    let task = Serve { args: args.clone(), auth, http, channel: channel.clone(), accounts, tenants };
    with_service_on(&args, channel, task).await?
}

/// `serve` (with `http`) or `worker`, on the service once it is connected.
struct Serve {
    args: ServeArgs,
    auth: Auth,
    http: bool,
    /// The channel charged, whose statements are reconciled.
    channel: Arc<dyn Channel>,
    /// The tenants' merchant ids and the notification secrets.
    accounts: onceflow_payments::ChannelAccounts,
    /// The tenants reconciled.
    tenants: Vec<String>,
}

impl OnPayments for Serve {
    type Output = Result<(), Failure>;

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
        let Self { args, auth, http, channel, accounts, tenants } = self;
        warn_of_a_pretend_channel(&args);
        let payments = payments.with_retention(args.retention.retention()).with_events(args.events.settings());
        let background = payments.engine().spawn_background();
        let retention = payments.spawn_retention(args.gc_interval);
        // Webhook deliveries (contracts/events.md): the dispatcher and the attempts, in `serve` and `worker`.
        let deliveries = payments.events().spawn();
        let reconciler = onceflow_payments::Reconciler::new(payments.clone(), channel, accounts.clone(), tenants);
        let reconciling = reconciler.spawn_daily(args.channel_word.reconcile_at);
        let unresolved = spawn_unresolved_warnings(payments.clone(), args.unresolved_warn);
        // The channel's word left to deliver (recorded while another process ran its workflow, a statement's).
        let words = onceflow_payments::spawn_word_delivery(payments.engine().clone(), WORD_DELIVERY);
        if http {
            crate::metrics::install();
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .map_err(|e| ConfigError(format!("cannot listen on {}: {e}", args.listen)))?;
            tracing::info!(listen = %args.listen, database = %redact(&args.database.database_url), "serving");
            let state = AppState {
                payments: payments.clone(),
                auth,
                wait: Duration::from_millis(args.wait_ms),
                body_read_timeout: args.body_read_timeout,
                mock_channel: charges_the_mock(&args),
            };
            let limits = http_limits(&args);
            let app = crate::app(state).layer(axum::Extension(Arc::new(accounts)));
            crate::server::serve(listener, app, limits, shutdown_signal()).await?;
        } else {
            tracing::info!("worker running");
            shutdown_signal().await;
        }
        tracing::info!("shutting down: releasing in-flight workflows");
        payments.engine().shutdown(SHUTDOWN_GRACE).await.map_err(|e| Failure::Other(e.into()))?;
        background.abort();
        unresolved.abort();
        retention.abort();
        // An attempt in flight is dropped: its lease expires and a process sends it again, with the same id.
        deliveries.abort();
        reconciling.abort();
        words.abort();
        Ok(())
    }
}

/// How often `serve` and `worker` deliver the channel's words not taken up yet.
const WORD_DELIVERY: Duration = Duration::from_secs(1);

/// What the HTTP server of `args` allows its clients.
fn http_limits(args: &ServeArgs) -> crate::server::Limits {
    crate::server::Limits {
        header_read_timeout: args.header_read_timeout,
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        max_header_bytes: usize::try_from(args.max_header_bytes).unwrap_or(usize::MAX),
    }
}

/// How many overdue unresolved payments one check reads (oldest first): what bounds the memory of warned ones.
const UNRESOLVED_BATCH: i64 = 1000;

/// Every `min(threshold, 30 s)`, logs one warning per payment still unresolved (its record `processing`) for
/// longer than `threshold`, once per process: the payments warned about are remembered until they are no longer
/// overdue and unresolved. They are never failed here; the recovery loop keeps retrying them.
fn spawn_unresolved_warnings<S: PaymentStore>(
    payments: Payments<S>,
    threshold: Duration,
) -> tokio::task::JoinHandle<()> {
    let period = threshold.clamp(Duration::from_millis(100), Duration::from_secs(30));
    let threshold_ms = i64::try_from(threshold.as_millis()).unwrap_or(i64::MAX);
    tokio::spawn(async move {
        let mut warned: std::collections::HashSet<(String, RequestNo)> = std::collections::HashSet::new();
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = chrono::Utc::now().timestamp_millis();
            let created_before = now.saturating_sub(threshold_ms);
            let overdue =
                match payments.engine().store().unresolved_before(None, created_before, UNRESOLVED_BATCH).await {
                    Ok(overdue) => overdue,
                    Err(e) => {
                        tracing::debug!(error = %e, "could not check for unresolved payments");
                        continue;
                    }
                };
            // Forget the payments resolved since (a payment warned about stays overdue while it is unresolved,
            // and the oldest come first, so it stays in the batch).
            let current: std::collections::HashSet<(&str, &str)> =
                overdue.iter().map(|(t, r, _)| (t.as_str(), r.as_str())).collect();
            warned.retain(|(t, r)| current.contains(&(t.as_str(), r.as_str())));
            for (tenant, request_no, created_at) in overdue {
                let key = (tenant, request_no);
                if warned.contains(&key) {
                    continue;
                }
                let age = Duration::from_secs(u64::try_from((now - created_at) / 1000).unwrap_or(0));
                tracing::warn!(tenant = %key.0, request_no = %key.1, age = %humantime::format_duration(age),
                    "payment unresolved: its charge outcome is still unknown or processing; it is retried, never auto-failed");
                warned.insert(key);
            }
        }
    })
}

async fn consume(args: crate::config::ConsumeArgs) -> Result<(), Failure> {
    let settings = crate::consume::Settings::from_args(&args)?;
    let retention = args.serve.retention.retention();
    let consume = Consume { serve: args.serve.clone(), settings, metrics_listen: args.metrics_listen, retention };
    with_service(&args.serve, consume).await?
}

/// `consume`, on the service once it is connected (its command tokens live `--token-ttl`).
struct Consume {
    serve: ServeArgs,
    settings: crate::consume::Settings,
    retention: onceflow_payments::Retention,
    metrics_listen: Option<std::net::SocketAddr>,
}

impl OnPayments for Consume {
    type Output = Result<(), Failure>;

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
        warn_of_a_pretend_channel(&self.serve);
        let payments = payments.with_retention(self.retention);
        let background = payments.engine().spawn_background();
        crate::metrics::install();
        if let Some(listen) = self.metrics_listen {
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|e| ConfigError(format!("cannot listen on {listen}: {e}")))?;
            // The same bounds as `serve`'s (header and connection limits): the port is as open as the API's.
            let limits = http_limits(&self.serve);
            tokio::spawn(crate::server::serve(listener, crate::consume::metrics_app(), limits, std::future::pending()));
        }
        let stop = tokio_util::sync::CancellationToken::new();
        let signal = stop.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            signal.cancel();
        });
        let consumed = crate::consume::run(payments.clone(), self.settings, stop).await;
        tracing::info!("shutting down: releasing in-flight workflows");
        payments.engine().shutdown(SHUTDOWN_GRACE).await.map_err(|e| Failure::Other(e.into()))?;
        background.abort();
        consumed.map_err(Failure::Other)
    }
}

/// `migrate`: connecting migrated; nothing else to do.
struct Migrated;

impl OnPayments for Migrated {
    type Output = ();

    async fn run<S: PaymentStore>(self, _payments: Payments<S>) {}
}

async fn migrate(db: DatabaseArgs) -> Result<(), Failure> {
    with_database(&db, Migrated).await?;
    println!("migrations applied to {}", redact(&db.database_url));
    Ok(())
}

async fn gc(args: GcArgs) -> Result<(), Failure> {
    let task =
        crate::gc::Gc { retention: args.retention.retention(), events: args.events.settings(), dry_run: args.dry_run };
    if !args.dry_run {
        return with_database(&args.database, task).await?.map_err(Failure::Other);
    }
    // A dry run changes nothing, the schema included (an operator's look during a rolling deploy).
    let channel = Arc::new(MockChannel::reliable());
    let url = &args.database.database_url;
    let counted = crate::database::with_payments_as_is(url, channel, EngineConfig::default(), 2, task).await?;
    counted.map_err(|e| Failure::Other(e.context("is the database migrated? run `onceflow migrate` first")))
}

async fn mock_channel(args: MockChannelArgs) -> Result<(), Failure> {
    for (name, rate) in [
        ("--decline-rate", args.decline_rate),
        ("--error-before-rate", args.error_before_rate),
        ("--error-after-rate", args.error_after_rate),
        ("--slow-rate", args.slow_rate),
        ("--processing-rate", args.processing_rate),
        ("--refund-fail-rate", args.refund_fail_rate),
        ("--refund-processing-rate", args.refund_processing_rate),
        ("--refund-error-after-rate", args.refund_error_after_rate),
    ] {
        if !(0.0..=1.0).contains(&rate) {
            return Err(ConfigError(format!("{name} must be between 0.0 and 1.0 (got {rate})")).into());
        }
    }
    let channel = MockChannel::new(MockChannelConfig {
        latency_ms: args.latency_ms,
        decline_rate: args.decline_rate,
        error_before_rate: args.error_before_rate,
        error_after_rate: args.error_after_rate,
        slow_rate: args.slow_rate,
        slow_ms: args.slow_ms,
        processing_rate: args.processing_rate,
        settle_ms: args.settle_ms,
        hold_ms: args.hold_ms,
        refund_fail_rate: args.refund_fail_rate,
        refund_processing_rate: args.refund_processing_rate,
        refund_error_after_rate: args.refund_error_after_rate,
        seed: args.seed,
        notify_secrets: args
            .notify_secret
            .iter()
            .map(|pair| crate::config::parse_pairs(pair, '=', "--notify-secret", "merchant=secret"))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect(),
        notify_schedule: args.notify_schedule.clone(),
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| ConfigError(format!("cannot listen on {}: {e}", args.listen)))?;
    tracing::info!(listen = %args.listen, "mock channel serving");
    axum::serve(listener, mock_channel_router(channel)).with_graceful_shutdown(shutdown_signal()).await?;
    Ok(())
}

async fn workflows(cmd: WorkflowsCommand) -> Result<(), Failure> {
    let db = match &cmd {
        WorkflowsCommand::List { database, .. }
        | WorkflowsCommand::Show { database, .. }
        | WorkflowsCommand::Retry { database, .. }
        | WorkflowsCommand::Cancel { database, .. } => database.clone(),
    };
    let read_only = matches!(cmd, WorkflowsCommand::List { .. } | WorkflowsCommand::Show { .. });
    let task = crate::operate::Operate(cmd);
    let done = if read_only {
        // Looking never migrates: an operator's look must not change the schema under a rolling deploy.
        let channel = Arc::new(MockChannel::reliable());
        crate::database::with_payments_as_is(&db.database_url, channel, EngineConfig::default(), 2, task).await?
    } else {
        with_database(&db, task).await?
    };
    done.map_err(|e| match e {
        onceflow_engine::Error::Database(_) if read_only => {
            Failure::Other(anyhow::Error::new(e).context("is the database migrated? run `onceflow migrate` first"))
        }
        e => Failure::Other(e.into()),
    })
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
