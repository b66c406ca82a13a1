//! Helpers for onceflow's tests: a fresh database per test on each backend, a business table that counts
//! effects, and a test workflow whose steps can be made to stop at chosen points.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use onceflow_engine::{
    BoxFuture, Compensation, Conn, Failure, Interrupt, MySqlStore, PgStore, Previous, RetryPolicy, SqliteStore,
    StepError, Store, Workflow, WorkflowContext, step,
};
use onceflow_payments::PaymentStore;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, mpsc};

pub mod baseline;

/// A store the tests can count business effects in.
pub trait TestDb: Store {
    /// Creates the `effects` table.
    fn create_effects(&self) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Records `what` for `workflow_id` inside a step's transaction.
    fn effect<'c>(conn: &'c mut Conn<Self>, workflow_id: String, what: String) -> BoxFuture<'c, Result<(), StepError>>;
    /// Runs one statement with one text parameter (written `$1`, on every backend): for tests that reach past
    /// the API.
    fn execute(&self, sql: &'static str, arg: &str) -> impl Future<Output = anyhow::Result<u64>> + Send;
    /// Another pool on the same database, as another process would have.
    fn another_pool(&self) -> impl Future<Output = anyhow::Result<Self>> + Send;
    /// Creates the `locks` table with rows 1 and 2, for tests that make transactions collide.
    fn create_locks(&self) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Increments `locks` row `id` inside a step's transaction, holding its row lock until the commit.
    fn touch<'c>(conn: &'c mut Conn<Self>, id: i32) -> BoxFuture<'c, Result<(), StepError>>;
    /// The effects of `workflow_id`, in the order they committed.
    fn effects(&self, workflow_id: &str) -> impl Future<Output = anyhow::Result<Vec<String>>> + Send;
}

/// The same business SQL on every backend; only the table's id column and the parameter style differ.
macro_rules! impl_test_db {
    ($store:ident, $pool:ty, $id_column:literal, $p1:literal, $p2:literal) => {
        impl TestDb for $store {
            async fn another_pool(&self) -> anyhow::Result<Self> {
                let options = (*self.pool().connect_options()).clone();
                Ok($store::from_pool(<$pool>::connect_with(options).await?))
            }

            async fn execute(&self, sql: &'static str, arg: &str) -> anyhow::Result<u64> {
                let sql = sqlx::AssertSqlSafe(sql.replace("$1", $p1));
                Ok(sqlx::query(sql).bind(arg).execute(self.pool()).await?.rows_affected())
            }

            async fn create_effects(&self) -> anyhow::Result<()> {
                sqlx::query(concat!(
                    "CREATE TABLE IF NOT EXISTS effects (id ",
                    $id_column,
                    ", workflow_id TEXT NOT NULL, what TEXT NOT NULL)"
                ))
                .execute(self.pool())
                .await?;
                Ok(())
            }

            fn effect<'c>(
                conn: &'c mut Conn<Self>,
                workflow_id: String,
                what: String,
            ) -> BoxFuture<'c, Result<(), StepError>> {
                Box::pin(async move {
                    sqlx::query(concat!("INSERT INTO effects (workflow_id, what) VALUES (", $p1, ", ", $p2, ")"))
                        .bind(workflow_id)
                        .bind(what)
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            }

            async fn create_locks(&self) -> anyhow::Result<()> {
                sqlx::query("CREATE TABLE locks (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
                    .execute(self.pool())
                    .await?;
                sqlx::query("INSERT INTO locks (id, n) VALUES (1, 0), (2, 0)").execute(self.pool()).await?;
                Ok(())
            }

            fn touch<'c>(conn: &'c mut Conn<Self>, id: i32) -> BoxFuture<'c, Result<(), StepError>> {
                Box::pin(async move {
                    sqlx::query(concat!("UPDATE locks SET n = n + 1 WHERE id = ", $p1)).bind(id).execute(conn).await?;
                    Ok(())
                })
            }

            async fn effects(&self, workflow_id: &str) -> anyhow::Result<Vec<String>> {
                Ok(sqlx::query_scalar(concat!("SELECT what FROM effects WHERE workflow_id = ", $p1, " ORDER BY id"))
                    .bind(workflow_id)
                    .fetch_all(self.pool())
                    .await?)
            }
        }
    };
}

impl_test_db!(SqliteStore, sqlx::SqlitePool, "INTEGER PRIMARY KEY AUTOINCREMENT", "$1", "$2");
impl_test_db!(PgStore, sqlx::PgPool, "BIGSERIAL PRIMARY KEY", "$1", "$2");
impl_test_db!(MySqlStore, sqlx::MySqlPool, "BIGINT AUTO_INCREMENT PRIMARY KEY", "?", "?");

/// A fresh, migrated SQLite database in a temporary file.
pub async fn sqlite_store() -> anyhow::Result<SqliteStore> {
    let path = std::env::temp_dir().join(format!("onceflow-test-{}.db", uuid::Uuid::new_v4()));
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display())).await?;
    store.migrate_payments().await?;
    store.create_effects().await?;
    Ok(store)
}

/// A URL of a fresh, migrated Postgres database, created from `DATABASE_URL`; `None` when it is not set.
pub async fn pg_url() -> anyhow::Result<Option<String>> {
    let Ok(base) = std::env::var("DATABASE_URL") else {
        return Ok(None);
    };
    let name = format!("onceflow_test_{}", uuid::Uuid::new_v4().simple());
    let admin = PgStore::connect(&base, 1).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(admin.pool()).await?;
    admin.pool().close().await;
    let url = with_database(&base, &name, "DATABASE_URL")?;
    let store = PgStore::connect(&url, 4).await?;
    store.migrate_payments().await?;
    store.create_effects().await?;
    store.pool().close().await;
    Ok(Some(url))
}

/// A URL of a fresh, migrated MySQL / MariaDB database, created on the server of `MYSQL_URL`; `None` when it
/// is not set.
pub async fn mysql_url() -> anyhow::Result<Option<String>> {
    let Ok(base) = std::env::var("MYSQL_URL") else {
        return Ok(None);
    };
    let name = format!("onceflow_test_{}", uuid::Uuid::new_v4().simple());
    let admin = MySqlStore::connect(&base, 1).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(admin.pool()).await?;
    admin.pool().close().await;
    let url = with_database(&base, &name, "MYSQL_URL")?;
    let store = MySqlStore::connect(&url, 4).await?;
    store.migrate_payments().await?;
    store.create_effects().await?;
    store.pool().close().await;
    Ok(Some(url))
}

/// A fresh, migrated MySQL / MariaDB database from `MYSQL_URL`; `None` when it is not set.
pub async fn mysql_store() -> anyhow::Result<Option<MySqlStore>> {
    match mysql_url().await? {
        Some(url) => Ok(Some(MySqlStore::connect(&url, 16).await?)),
        None => Ok(None),
    }
}

/// `base` (`scheme://server/database`) naming database `name` instead.
fn with_database(base: &str, name: &str, var: &str) -> anyhow::Result<String> {
    match base.rsplit_once('/') {
        Some((server, _db)) if server.contains("://") && !server.ends_with('/') => Ok(format!("{server}/{name}")),
        _ => anyhow::bail!("{var} must end with /database: {base}"),
    }
}

/// A fresh, migrated Postgres database from `DATABASE_URL`; `None` when it is not set.
pub async fn pg_store() -> anyhow::Result<Option<PgStore>> {
    match pg_url().await? {
        Some(url) => Ok(Some(PgStore::connect(&url, 16).await?)),
        None => Ok(None),
    }
}

/// Generates `NAME::sqlite`, `NAME::postgres` and `NAME::mysql` tests from `async fn NAME<S: TestDb>(store: S)`.
/// Postgres runs when `DATABASE_URL` is set, MySQL when `MYSQL_URL` is.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            onceflow_tests::backend_test!(sqlite, $name);
            onceflow_tests::backend_test!(postgres, $name);
            onceflow_tests::backend_test!(mysql, $name);
        }
    )*};
}

/// As [`on_every_backend!`], on SQLite and Postgres only (for what MySQL does not have, like statement phases).
#[macro_export]
macro_rules! on_sqlite_and_postgres {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            onceflow_tests::backend_test!(sqlite, $name);
            onceflow_tests::backend_test!(postgres, $name);
        }
    )*};
}

/// One test `BACKEND` running `super::NAME` on a fresh store of that backend (skipped when its URL is unset).
#[macro_export]
macro_rules! backend_test {
    (sqlite, $name:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sqlite() {
            let store = onceflow_tests::sqlite_store().await.expect("sqlite store");
            super::$name(store).await;
        }
    };
    (postgres, $name:ident) => {
        #[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn postgres() {
            let Some(store) = onceflow_tests::pg_store().await.expect("postgres store") else {
                eprintln!("skipped: DATABASE_URL is not set");
                return;
            };
            super::$name(store).await;
        }
    };
    (mysql, $name:ident) => {
        #[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mysql() {
            let Some(store) = onceflow_tests::mysql_store().await.expect("mysql store") else {
                eprintln!("skipped: MYSQL_URL is not set");
                return;
            };
            super::$name(store).await;
        }
    };
}

/// Points where [`Steps`] can be made to stop, and what its external steps saw.
#[derive(Default)]
pub struct Hooks {
    /// The point to stop at: `e1`, `b`, `e2`.
    pub stop_at: Mutex<Option<String>>,
    /// Told when the stop point is reached.
    pub reached: Mutex<Option<mpsc::UnboundedSender<String>>>,
    /// Released to let a stopped step go on (else it waits forever).
    pub resume: tokio::sync::Notify,
    /// Calls of the external steps, in this engine.
    pub external_calls: AtomicUsize,
    /// `Previous` values the external steps were given.
    pub previous_seen: std::sync::Mutex<Vec<Previous>>,
    /// Make every compensation fail (retryably, until its attempts run out).
    pub fail_compensations: AtomicBool,
}

impl Hooks {
    /// Arms a stop at `point` and returns the receiver told when it is reached.
    pub async fn stop_at(&self, point: &str) -> mpsc::UnboundedReceiver<String> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.stop_at.lock().await = Some(point.to_owned());
        *self.reached.lock().await = Some(tx);
        rx
    }

    async fn point(&self, name: &str) {
        let stop = self.stop_at.lock().await.as_deref() == Some(name);
        if stop {
            *self.stop_at.lock().await = None;
            if let Some(tx) = self.reached.lock().await.as_ref() {
                let _ = tx.send(name.to_owned());
            }
            self.resume.notified().await;
        }
    }
}

/// A transactional step body that records `what` for `workflow_id`.
pub fn effect_step<S: TestDb>(
    workflow_id: String,
    what: &'static str,
) -> impl for<'c> FnOnce(&'c mut Conn<S>) -> BoxFuture<'c, Result<(), StepError>> + Send {
    move |conn| S::effect(conn, workflow_id, what.to_owned())
}

/// Input of [`Steps`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepsInput {
    /// A label, so different inputs can be told apart.
    pub label: String,
    /// End with a terminal failure after the last step.
    pub fail: bool,
}

/// The test workflow: `a` (tx), `e1` (external), `b` (tx), `e2` (external), `c` (tx); each tx step records an
/// effect, `a`, `b` and `e1` register compensations that record `undo:<step>`.
pub struct Steps {
    /// Stop points and observations.
    pub hooks: Arc<Hooks>,
}

impl<S: TestDb> Workflow<S> for Steps {
    const NAME: &'static str = "steps";
    type Input = StepsInput;
    type Output = String;

    async fn run(&self, ctx: &mut WorkflowContext<S>, input: StepsInput) -> Result<String, Interrupt> {
        let id = ctx.workflow_id().to_owned();
        let hooks = &self.hooks;
        let effect = |what: &'static str| effect_step::<S>(id.clone(), what);
        ctx.transactional(step("a").compensate_with("undo", "a"), effect("a")).await?;
        ctx.external(step("e1").compensate_with("undo", "e1"), |attempt| async move {
            hooks.previous_seen.lock().map(|mut p| p.push(attempt.previous.clone())).ok();
            hooks.point("e1").await;
            hooks.external_calls.fetch_add(1, Ordering::SeqCst);
            Ok(attempt.number)
        })
        .await?;
        let b_id = id.clone();
        let b_hooks = hooks.clone();
        ctx.transactional(step("b").compensate_with("undo", "b"), move |conn| -> BoxFuture<'_, _> {
            Box::pin(async move {
                S::effect(conn, b_id, "b".to_owned()).await?;
                b_hooks.point("b").await;
                Ok(())
            })
        })
        .await?;
        ctx.external("e2", |_attempt| async move {
            hooks.point("e2").await;
            hooks.external_calls.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await?;
        ctx.transactional("c", effect("c")).await?;
        if input.fail {
            ctx.transactional("boom", |_conn| -> BoxFuture<'_, Result<(), StepError>> {
                Box::pin(async { Err(StepError::Terminal(Failure::new("boom", "the test asked for a failure"))) })
            })
            .await?;
        }
        Ok(format!("done:{}", input.label))
    }

    async fn compensate(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &Compensation,
        _failure: &Failure,
    ) -> Result<(), Interrupt> {
        let what = format!("undo:{}", compensation.input.as_str().unwrap_or("?"));
        if self.hooks.fail_compensations.load(Ordering::SeqCst) && what == "undo:b" {
            let policy = RetryPolicy {
                initial_interval: Duration::from_millis(1),
                max_attempts: 3,
                jitter: false,
                ..RetryPolicy::default()
            };
            ctx.external(step("flaky").retry(policy), |_| async {
                Err::<(), _>(StepError::Retryable("the refund service is down".into()))
            })
            .await?;
        }
        let id = ctx.workflow_id().to_owned();
        ctx.transactional("undo", move |conn| S::effect(conn, id, what)).await
    }
}

/// Valid values for the payment service's typed parameters, from literals (a typo panics).
pub mod ids {
    use onceflow_payments::{Currency, OrderNo, PaymentRequest, RequestNo, Token};

    /// An order number.
    pub fn order_no(value: impl Into<String>) -> OrderNo {
        OrderNo::parse(value).expect("a valid order_no")
    }

    /// A payment number.
    pub fn request_no(value: impl Into<String>) -> RequestNo {
        RequestNo::parse(value).expect("a valid request_no")
    }

    /// A token as a client presents it.
    pub fn token(value: impl Into<String>) -> Token {
        Token::parse(value).expect("a valid token")
    }

    /// A currency.
    pub fn currency(value: &str) -> Currency {
        Currency::parse(value).expect("a valid currency")
    }

    /// `CNY`.
    pub fn cny() -> Currency {
        currency("CNY")
    }

    /// A request to pay `order_no` `amount` CNY, as the payment `request_no`.
    pub fn pay_request(order: impl Into<String>, amount: i64, request_no: Option<&str>) -> PaymentRequest {
        PaymentRequest::new(order_no(order), amount, cny(), request_no.map(self::request_no)).expect("a valid request")
    }
}

/// Ends every client session of `url`'s Postgres database but the caller's own (a store's held and pool
/// connections with them), as a restart would, and waits a moment for their goodbyes; how many it ended. The
/// sessions are listed first and ended one by one, by pid: `pg_terminate_backend` in a query's filter may run
/// before the filter on the database, and end other tests' sessions.
pub async fn end_pg_sessions(url: &str) -> usize {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(url).await.expect("connect to end sessions");
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() \
         AND backend_type = 'client backend'",
    )
    .fetch_all(&mut admin)
    .await
    .expect("list the sessions");
    assert!(!pids.is_empty(), "no sessions to end");
    for &pid in &pids {
        // A session that ended meanwhile answers false.
        sqlx::query("SELECT pg_terminate_backend($1)").bind(pid).execute(&mut admin).await.expect("end a session");
    }
    let _ = admin.close().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    pids.len()
}

/// [`end_pg_sessions`] on MySQL / MariaDB: every session of `url`'s database but the caller's own is killed.
pub async fn end_mysql_sessions(url: &str) -> usize {
    use sqlx::Connection;
    let mut admin = sqlx::MySqlConnection::connect(url).await.expect("connect to end sessions");
    // Signed, as MariaDB has it (MySQL 8's column is unsigned).
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT CAST(id AS SIGNED) FROM information_schema.processlist WHERE db = DATABASE() \
         AND id <> CONNECTION_ID()",
    )
    .fetch_all(&mut admin)
    .await
    .expect("list the sessions");
    assert!(!ids.is_empty(), "no sessions to end");
    for &id in &ids {
        match sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}"))).execute(&mut admin).await {
            Ok(_) => {}
            // ER_NO_SUCH_THREAD: it ended meanwhile.
            Err(sqlx::Error::Database(e))
                if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|e| e.number() == 1094) => {}
            Err(e) => panic!("end a session: {e}"),
        }
    }
    let _ = admin.close().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    ids.len()
}
