//! The payment service on whichever database the URL names, behind one type the HTTP layer can hold.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::store::WorkflowRecord;
use onceflow_engine::{EngineConfig, MySqlStore, PgStore, SqliteStore, Store, WorkflowView};
use onceflow_payments::{
    Channel, IssuedToken, Order, PayRequest, PayResponse, PaymentRecord, PaymentStore, Payments, Result as PayResult,
};

use crate::config::ConfigError;

/// The payment service on Postgres, SQLite or MySQL.
#[derive(Clone)]
pub enum Backend {
    /// Production: many processes against one Postgres.
    Postgres(Payments<PgStore>),
    /// Embedded: one process.
    Sqlite(Payments<SqliteStore>),
    /// Many processes against one MySQL 8 / MariaDB 10.6+.
    MySql(Payments<MySqlStore>),
}

macro_rules! on_backend {
    ($self:expr, $p:ident => $body:expr) => {
        match $self {
            Backend::Postgres($p) => $body,
            Backend::Sqlite($p) => $body,
            Backend::MySql($p) => $body,
        }
    };
}

impl Backend {
    /// Connects to `url` and migrates. Errors are one line, for exit code 2.
    pub async fn connect(
        url: &str,
        channel: Arc<dyn Channel>,
        config: EngineConfig,
        pool_size: u32,
    ) -> Result<Self, ConfigError> {
        let unreachable = |e: onceflow_engine::Error| ConfigError(format!("database {}: {e}", redact(url)));
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let store = PgStore::connect(url, pool_size).await.map_err(unreachable)?;
            store.migrate_payments().await.map_err(unreachable)?;
            Ok(Self::Postgres(Payments::new(store, channel, config)))
        } else if url.starts_with("sqlite:") {
            let store = SqliteStore::connect(url).await.map_err(unreachable)?;
            store.migrate_payments().await.map_err(unreachable)?;
            Ok(Self::Sqlite(Payments::new(store, channel, config)))
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let store = MySqlStore::connect(url, pool_size).await.map_err(unreachable)?;
            store.migrate_payments().await.map_err(unreachable)?;
            Ok(Self::MySql(Payments::new(store, channel, config)))
        } else {
            Err(ConfigError(format!(
                "--database-url must start with postgres://, mysql:// or sqlite:// (got `{}`)",
                redact(url)
            )))
        }
    }

    /// Starts the recovery loop and heartbeat.
    pub fn spawn_background(&self) -> tokio::task::JoinHandle<()> {
        on_backend!(self, p => p.engine().spawn_background())
    }

    /// Graceful shutdown of the engine.
    pub async fn shutdown(&self, grace: Duration) -> onceflow_engine::Result<()> {
        on_backend!(self, p => p.engine().shutdown(grace).await)
    }

    /// See [`Payments::create_order`].
    pub async fn create_order(
        &self,
        tenant: &str,
        order_no: &str,
        amount: i64,
        currency: &str,
    ) -> PayResult<(Order, bool)> {
        on_backend!(self, p => p.create_order(tenant, order_no, amount, currency).await)
    }

    /// See [`Payments::order`].
    pub async fn order(&self, tenant: &str, order_no: &str) -> PayResult<Option<Order>> {
        on_backend!(self, p => p.order(tenant, order_no).await)
    }

    /// See [`Payments::issue_token`].
    pub async fn issue_token(&self, tenant: &str) -> PayResult<IssuedToken> {
        on_backend!(self, p => p.issue_token(tenant).await)
    }

    /// See [`Payments::pay`].
    pub async fn pay(
        &self,
        tenant: &str,
        token: &str,
        route: &str,
        request: &PayRequest,
        wait: Duration,
    ) -> PayResult<PayResponse> {
        on_backend!(self, p => p.pay(tenant, token, route, request, wait).await)
    }

    /// See [`Payments::pay_command`].
    pub async fn pay_command(&self, tenant: &str, request: &PayRequest, wait: Duration) -> PayResult<PayResponse> {
        on_backend!(self, p => p.pay_command(tenant, request, wait).await)
    }

    /// See [`Payments::payment`].
    pub async fn payment(&self, tenant: &str, request_no: &str) -> PayResult<Option<PaymentRecord>> {
        on_backend!(self, p => p.payment(tenant, request_no).await)
    }

    /// A workflow with its steps.
    pub async fn workflow(&self, id: &str) -> onceflow_engine::Result<Option<WorkflowView>> {
        on_backend!(self, p => p.engine().workflow(id).await)
    }

    /// A page of workflows.
    pub async fn workflows(
        &self,
        state: Option<&str>,
        before: Option<i64>,
        limit: i64,
    ) -> onceflow_engine::Result<Vec<WorkflowRecord>> {
        on_backend!(self, p => p.engine().list(state, before, limit).await)
    }

    /// Operator retry.
    pub async fn retry(&self, id: &str) -> onceflow_engine::Result<WorkflowRecord> {
        on_backend!(self, p => p.engine().retry(id).await)
    }

    /// Operator cancel.
    pub async fn cancel(&self, id: &str) -> onceflow_engine::Result<WorkflowRecord> {
        on_backend!(self, p => p.engine().cancel(id).await)
    }

    /// Whether the database answers.
    pub async fn ready(&self) -> bool {
        on_backend!(self, p => sqlx::query("SELECT 1").execute(p.engine().store().pool()).await.is_ok())
    }

    /// How many workflows are in each state.
    pub async fn workflow_counts(&self) -> Vec<(String, i64)> {
        const SQL: &str = "SELECT state, count(*) FROM workflows GROUP BY state";
        on_backend!(self, p => sqlx::query_as(SQL).fetch_all(p.engine().store().pool()).await.unwrap_or_default())
    }

    /// See [`PaymentStore::unresolved`]; `None` when the database does not answer.
    pub async fn unresolved_payments(&self) -> Option<(i64, Option<i64>)> {
        on_backend!(self, p => p.engine().store().unresolved().await.ok())
    }

    /// See [`PaymentStore::unresolved_before`].
    pub async fn unresolved_payments_before(
        &self,
        created_before: i64,
        limit: i64,
    ) -> PayResult<Vec<(String, String, i64)>> {
        Ok(on_backend!(self, p => p.engine().store().unresolved_before(created_before, limit).await?))
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
