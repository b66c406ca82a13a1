//! Migrations on Postgres: one process at a time, without deadlocking an index built `CONCURRENTLY`, and
//! mending what a build that died left behind.
//!
//! Every `serve`, `worker` and `consume` migrates at start-up, so in a rolling deploy several processes do it at
//! once. sqlx's own migration lock *waits* in `pg_advisory_lock`: a statement that holds a snapshot for as long
//! as another process migrates. `CREATE INDEX CONCURRENTLY` waits for every snapshot older than its own to end,
//! so the build and the waiters wait for each other, and Postgres aborts one side ("deadlock detected": two of
//! three processes started together exited). Here the lock is *tried*, every [`RETRY`]: between tries a waiting
//! process holds no snapshot, and the build goes on.
//!
//! A build that died half-way (its process killed) leaves its index INVALID and its migration unrecorded:
//! `IF NOT EXISTS` would keep the broken index for good, a plain `CREATE` fail every later start. Under the
//! lock, before migrating, such an index of a migration not yet applied is dropped, so the migration builds it
//! again.

use std::time::{Duration, Instant};

use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::{Postgres, Row};

use super::common;
use crate::error::Result;

/// The advisory lock of migrations (per database; the retention pass has another).
const LOCK: i64 = 0x6f6e_6365_666c_6f01;
/// How long a process waits between two tries of the lock.
const RETRY: Duration = Duration::from_millis(100);
/// How often a process still waiting says so.
const WAITING_LOG: Duration = Duration::from_secs(10);

/// Applies `migrator`'s migrations not yet applied, holding the migration lock.
pub(super) async fn run(pool: &sqlx::PgPool, migrator: &'static Migrator) -> Result<()> {
    let mut conn = pool.acquire().await?;
    // However this ends, the connection is closed rather than pooled: a lock it still held goes with it.
    conn.close_on_drop();
    wait_for_lock(&mut conn).await?;
    drop_broken_indexes(&mut conn, migrator).await?;
    let unlocked = common::without_lock(migrator);
    // `run_direct` is `run` on a connection we hold (the one with the lock), without `Acquire`'s lifetimes, which
    // do not fit a future that must be `Send`.
    unlocked.run_direct(None, &mut *conn, false).await?;
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(LOCK).execute(&mut *conn).await?;
    Ok(())
}

async fn wait_for_lock(conn: &mut PoolConnection<Postgres>) -> Result<()> {
    let started = Instant::now();
    let mut logged = started;
    loop {
        let locked: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(LOCK).fetch_one(&mut **conn).await?;
        if locked {
            return Ok(());
        }
        if logged.elapsed() >= WAITING_LOG {
            logged = Instant::now();
            let waited = started.elapsed().as_secs();
            tracing::info!(waited_secs = waited, "waiting for another process's migrations to finish");
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Drops every INVALID index that a migration of `migrator` not yet applied builds `CONCURRENTLY`.
async fn drop_broken_indexes(conn: &mut PoolConnection<Postgres>, migrator: &Migrator) -> Result<()> {
    let applied = format!("SELECT version FROM {}", migrator.table_name);
    let applied: Vec<i64> = match sqlx::query_scalar(sqlx::AssertSqlSafe(applied)).fetch_all(&mut **conn).await {
        Ok(applied) => applied,
        // A database never migrated has no index of ours either.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let pending = migrator.iter().filter(|m| !applied.contains(&m.version));
    let names: Vec<String> = pending.flat_map(|m| concurrent_indexes(m.sql.as_str())).collect();
    if names.is_empty() {
        return Ok(());
    }
    let broken = sqlx::query(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE NOT i.indisvalid AND c.relname = ANY($1) AND pg_catalog.pg_table_is_visible(c.oid)",
    )
    .bind(&names)
    .fetch_all(&mut **conn)
    .await?;
    for row in broken {
        let name: String = row.get(0);
        tracing::warn!(index = %name, "an earlier build of this index died half-way: dropping it to build it again");
        let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS \"{}\"", name.replace('"', "\"\""));
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop)).execute(&mut **conn).await?;
    }
    Ok(())
}

/// The names of the indexes `sql` creates `CONCURRENTLY` (`CREATE [UNIQUE] INDEX CONCURRENTLY [IF NOT EXISTS]
/// name`), comments skipped.
fn concurrent_indexes(sql: &str) -> Vec<String> {
    let code: String = sql.lines().map(|l| l.split("--").next().unwrap_or("")).collect::<Vec<_>>().join(" ");
    let words: Vec<String> = code.split_whitespace().map(str::to_ascii_lowercase).collect();
    let original: Vec<&str> = code.split_whitespace().collect();
    let mut names = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if w != "concurrently" || i < 1 || words[i - 1] != "index" {
            continue;
        }
        let mut at = i + 1;
        if words.get(at).map(String::as_str) == Some("if") {
            at += 3;
        }
        if let Some(name) = original.get(at).filter(|n| !n.eq_ignore_ascii_case("on")) {
            names.push(name.trim_matches('"').to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::concurrent_indexes;

    #[test]
    fn the_names_of_indexes_built_concurrently() {
        let sql = "-- no-transaction\n-- CREATE INDEX CONCURRENTLY not_me ON t (x);\n\
                   CREATE INDEX CONCURRENTLY IF NOT EXISTS tokens_retention ON idempotency_tokens\n    (state);";
        assert_eq!(concurrent_indexes(sql), ["tokens_retention"]);
        assert_eq!(concurrent_indexes("CREATE UNIQUE INDEX CONCURRENTLY \"a\" ON t (x)"), ["a"]);
        assert!(concurrent_indexes("CREATE INDEX a ON t (x); ALTER TABLE t ADD COLUMN c int").is_empty());
    }
}
