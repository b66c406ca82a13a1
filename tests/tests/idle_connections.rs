//! A pool connection that the server ended while it sat idle (a restart, an idle timeout, an operator's kill) is
//! pinged before it is lent, once idle `PING_IDLE` or more, and a new one is lent in its place (`store/ping.rs`).
//! The tests read through the pool; a transaction, and a commit that finds every held connection busy, take their
//! connection by the same acquire. (The held connections' own case is in `group_commit.rs`.)

use std::time::{Duration, Instant};

use onceflow_engine::store::PING_IDLE;
use onceflow_engine::{MySqlStore, PgStore, Store};

/// How long the tests leave the connections idle: past `PING_IDLE`.
const IDLE: Duration = PING_IDLE.saturating_add(Duration::from_millis(300));

/// Connections the tests leave idle in the pool.
const CONNECTIONS: usize = 4;

/// Waits until `pool` holds `CONNECTIONS` idle connections: sqlx pings a connection given back in a task of its
/// own, and one ended before that ping would be closed by it, not by the check under test.
async fn settled<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) {
    let started = Instant::now();
    while pool.num_idle() < CONNECTIONS {
        assert!(started.elapsed() < Duration::from_secs(5), "the pool kept {} idle connections", pool.num_idle());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test]
async fn postgres_does_not_lend_a_connection_the_server_ended_while_idle() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else { return };
    let store = PgStore::connect(&url, 8).await.unwrap();
    answered_after_the_sessions_end(store.pool(), "SELECT pg_sleep(0.05)", || onceflow_tests::end_pg_sessions(&url))
        .await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test]
async fn mysql_does_not_lend_a_connection_the_server_ended_while_idle() {
    let Some(url) = onceflow_tests::mysql_url().await.unwrap() else { return };
    let store = MySqlStore::connect(&url, 8).await.unwrap();
    answered_after_the_sessions_end(store.pool(), "SELECT SLEEP(0.05)", || onceflow_tests::end_mysql_sessions(&url))
        .await;
}

/// `CONNECTIONS` of `pool`'s connections used at once (each `sleep`s), then idle; every session of the database
/// ended by `end`; past `PING_IDLE`, every read through `pool` must be answered.
async fn answered_after_the_sessions_end<DB, F>(pool: &sqlx::Pool<DB>, sleep: &'static str, end: impl FnOnce() -> F)
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    F: Future<Output = usize>,
{
    let read = || sqlx::query(sleep).execute(pool);
    let (a, b, c, d) = tokio::join!(read(), read(), read(), read());
    assert!(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
    settled(pool).await;
    assert!(end().await >= CONNECTIONS);
    tokio::time::sleep(IDLE).await;
    for i in 0..6 {
        if let Err(e) = sqlx::query("SELECT 1").execute(pool).await {
            panic!("read {i}: {e}");
        }
    }
}
