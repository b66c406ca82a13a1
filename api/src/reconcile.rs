//! `onceflow reconcile --date D [--tenant T]`: one reconciliation of a day now, printing per tenant the counts
//! per class and the exceptions. Exit 0 whatever it found (exceptions are findings, not failures); 1 when the
//! statement could not be read or the database failed; another process reconciling is waited for.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::EngineConfig;
use onceflow_payments::{
    Channel, ChannelAccounts, HttpChannel, MockChannel, PaymentStore, Payments, ReconcileReport, Reconciler,
};

use crate::config::{ConfigError, ReconcileArgs, parse_api_keys, parse_pairs};
use crate::database::{OnPayments, with_payments};
use crate::run::Failure;

/// How long another process's run is waited for before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// The command.
pub(crate) async fn run(args: ReconcileArgs) -> Result<(), Failure> {
    let channel: Arc<dyn Channel> = match args.channel_url.as_str() {
        "mock" => Arc::new(MockChannel::reliable()),
        url if url.starts_with("http://") || url.starts_with("https://") => {
            Arc::new(HttpChannel::new(url, Duration::from_secs(30)).map_err(|e| ConfigError(e.to_string()))?)
        }
        url => return Err(ConfigError(format!("--channel-url must be an http(s) URL or `mock` (got `{url}`)")).into()),
    };
    let merchants = match &args.channel_merchants {
        Some(raw) => parse_pairs(raw, ':', "--channel-merchants", "tenant:merchant_id")?,
        None => Vec::new(),
    };
    let tenants: Vec<String> = match (&args.tenant, &args.api_keys) {
        (Some(t), _) => vec![t.clone()],
        (None, _) if !merchants.is_empty() => merchants.iter().map(|(t, _)| t.clone()).collect(),
        (None, Some(keys)) => parse_api_keys(keys)?.into_iter().map(|(t, _)| t).collect(),
        (None, None) => vec![crate::state::DEFAULT_TENANT.to_owned()],
    };
    let accounts = ChannelAccounts::new(merchants, Vec::new());
    let task = Reconcile { channel: channel.clone(), accounts, tenants, date: args.date };
    with_payments(&args.database.database_url, channel, EngineConfig::default(), 4, task).await?
}

struct Reconcile {
    channel: Arc<dyn Channel>,
    accounts: ChannelAccounts,
    tenants: Vec<String>,
    date: chrono::NaiveDate,
}

impl OnPayments for Reconcile {
    type Output = Result<(), Failure>;

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
        let reconciler = Reconciler::new(payments, self.channel, self.accounts, self.tenants);
        let started = std::time::Instant::now();
        let reports = loop {
            match reconciler.run_day(self.date, None).await {
                Ok(Some(reports)) => break reports,
                Ok(None) if started.elapsed() < LOCK_WAIT => {
                    eprintln!("another process is reconciling; waiting");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Ok(None) => return Err(Failure::Other(anyhow::anyhow!("another process kept reconciling"))),
                Err(e) => return Err(Failure::Other(e.into())),
            }
        };
        for report in reports {
            match report {
                ReconcileReport::Done(done) => print!("{}", done.render()),
                ReconcileReport::NoStatement { tenant, date } => {
                    println!("{tenant} {date}: the channel has no statement of this day yet; nothing recorded");
                }
            }
        }
        Ok(())
    }
}
