//! The database a URL names, chosen once at start-up: a command is handed the payment service on that
//! database's store, and everything it runs from there is typed by that store — no choice per request.

use std::future::Future;
use std::sync::Arc;

use onceflow_engine::{EngineConfig, MySqlStore, PgStore, SqliteStore};
use onceflow_payments::{Channel, PaymentStore, Payments};

use crate::config::ConfigError;

/// Something that runs on the payment service, whichever database serves it.
pub trait OnPayments {
    /// What it gives back.
    type Output;

    /// Runs with the service on store `S`.
    fn run<S: PaymentStore>(self, payments: Payments<S>) -> impl Future<Output = Self::Output>;
}

/// The connections a process opens to a Postgres or MySQL server, and how it sends its commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// Connections at most.
    pub connections: u32,
    /// Postgres: one-statement commits sent at once before more wait and go together (see
    /// [`PgStore::group_commit`]); `0`, each on its own.
    pub commit_slots: usize,
}

impl Pool {
    /// `connections`, with the default group commit.
    pub fn of(connections: u32) -> Self {
        Self { connections, commit_slots: onceflow_engine::store::DEFAULT_COMMIT_SLOTS }
    }
}

/// Connects to the database `url` names (Postgres, MySQL or SQLite), migrates it, and runs `task` with the
/// payment service on it. Connection errors are one line, for exit code 2.
pub async fn with_payments<T: OnPayments>(
    url: &str,
    channel: Arc<dyn Channel>,
    config: EngineConfig,
    pool_size: u32,
    task: T,
) -> Result<T::Output, ConfigError> {
    with_payments_on(url, channel, config, Pool::of(pool_size), task).await
}

/// As [`with_payments`], with the connections and commits of `pool`.
pub async fn with_payments_on<T: OnPayments>(
    url: &str,
    channel: Arc<dyn Channel>,
    config: EngineConfig,
    pool: Pool,
    task: T,
) -> Result<T::Output, ConfigError> {
    on_database(url, channel, config, pool, true, task).await
}

/// As [`with_payments`], without migrating: for commands that only read, which must never change a database's
/// schema (an operator's look during a rolling deploy).
pub async fn with_payments_as_is<T: OnPayments>(
    url: &str,
    channel: Arc<dyn Channel>,
    config: EngineConfig,
    pool_size: u32,
    task: T,
) -> Result<T::Output, ConfigError> {
    on_database(url, channel, config, Pool::of(pool_size), false, task).await
}

async fn on_database<T: OnPayments>(
    url: &str,
    channel: Arc<dyn Channel>,
    config: EngineConfig,
    pool: Pool,
    migrate: bool,
    task: T,
) -> Result<T::Output, ConfigError> {
    let unreachable = |e: onceflow_engine::Error| ConfigError(format!("database {}: {e}", redact(url)));
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = PgStore::connect(url, pool.connections).await.map_err(unreachable)?.group_commit(pool.commit_slots);
        if migrate {
            store.migrate_payments().await.map_err(unreachable)?;
        }
        Ok(task.run(Payments::new(store, channel, config)).await)
    } else if url.starts_with("sqlite:") {
        let store = SqliteStore::connect(url).await.map_err(unreachable)?;
        if migrate {
            store.migrate_payments().await.map_err(unreachable)?;
        }
        Ok(task.run(Payments::new(store, channel, config)).await)
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        let store = MySqlStore::connect(url, pool.connections).await.map_err(unreachable)?;
        if migrate {
            store.migrate_payments().await.map_err(unreachable)?;
        }
        Ok(task.run(Payments::new(store, channel, config)).await)
    } else {
        Err(ConfigError(format!(
            "--database-url must start with postgres://, mysql:// or sqlite:// (got `{}`)",
            redact(url)
        )))
    }
}

/// `url` without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}
