//! Migrations on MySQL / MariaDB, one process at a time.
//!
//! Every `serve`, `worker` and `consume` migrates at start-up, so in a rolling deploy several processes do it at
//! once. sqlx's migration lock is `GET_LOCK(name, -1)`, which MariaDB answers with `NULL` without taking the
//! lock (a negative timeout is not "for ever" there): processes started together applied the same migration
//! twice and all but one failed on its history row's key. Here the lock is taken with a timeout of a second,
//! tried again until it is held; the migrations then run on that connection.

use std::time::{Duration, Instant};

use sqlx::MySql;
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;

use super::super::common;
use crate::error::Result;

/// The lock's name: server-wide, so it carries the database's (as a digest: a name has at most 64 characters).
const LOCK: &str = "SELECT GET_LOCK(CONCAT('onceflow.migrate.', MD5(DATABASE())), 1)";
const UNLOCK: &str = "SELECT RELEASE_LOCK(CONCAT('onceflow.migrate.', MD5(DATABASE())))";
/// How often a process still waiting says so.
const WAITING_LOG: Duration = Duration::from_secs(10);

/// Applies `migrator`'s migrations not yet applied, holding the migration lock.
pub(super) async fn run(pool: &sqlx::MySqlPool, migrator: &'static Migrator) -> Result<()> {
    let mut conn = pool.acquire().await?;
    // However this ends, the connection is closed rather than pooled: a lock it still held goes with it.
    conn.close_on_drop();
    wait_for_lock(&mut conn).await?;
    common::without_lock(migrator).run_direct(None, &mut *conn, false).await?;
    sqlx::query(UNLOCK).execute(&mut *conn).await?;
    Ok(())
}

async fn wait_for_lock(conn: &mut PoolConnection<MySql>) -> Result<()> {
    let started = Instant::now();
    let mut logged = started;
    loop {
        // 1 when taken, 0 after the second's wait, NULL on an error.
        let locked: Option<i64> = sqlx::query_scalar(LOCK).fetch_one(&mut **conn).await?;
        match locked {
            Some(1) => return Ok(()),
            Some(_) => {}
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        if logged.elapsed() >= WAITING_LOG {
            logged = Instant::now();
            let waited = started.elapsed().as_secs();
            tracing::info!(waited_secs = waited, "waiting for another process's migrations to finish");
        }
    }
}
