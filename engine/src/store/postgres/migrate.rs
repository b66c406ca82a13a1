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
//! A build whose process died leaves its index behind with its migration unrecorded: INVALID if the build
//! stopped half-way, valid if the server finished it after the process was gone. `IF NOT EXISTS` would keep a
//! broken index for good, a plain `CREATE` fail every later start. Under the lock, before migrating, such an
//! index of a migration not yet applied, found on that migration's table and not being built right now, is
//! dropped, so the migration builds it again.

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
    drop_leftover_indexes(&mut conn, migrator).await?;
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

/// Drops every index that a migration of `migrator` not yet applied builds `CONCURRENTLY` and that exists already
/// on its table: a build that died left it, INVALID (killed mid-build) or valid and unrecorded (the build finished
/// after its process was gone, before the migration's history row). Not one being built right now.
async fn drop_leftover_indexes(conn: &mut PoolConnection<Postgres>, migrator: &Migrator) -> Result<()> {
    let applied = format!("SELECT version FROM {}", migrator.table_name);
    let applied: Vec<i64> = match sqlx::query_scalar(sqlx::AssertSqlSafe(applied)).fetch_all(&mut **conn).await {
        Ok(applied) => applied,
        // A database never migrated has no index of ours either.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let pending = migrator.iter().filter(|m| !applied.contains(&m.version));
    let (names, tables): (Vec<String>, Vec<String>) = pending.flat_map(|m| concurrent_indexes(m.sql.as_str())).unzip();
    if names.is_empty() {
        return Ok(());
    }
    let leftovers = sqlx::query(
        "SELECT c.relname::text FROM unnest($1::text[], $2::text[]) AS wanted(name, tbl) \
         JOIN pg_class c ON c.relname = wanted.name AND pg_catalog.pg_table_is_visible(c.oid) \
         JOIN pg_index i ON i.indexrelid = c.oid \
         JOIN pg_class t ON t.oid = i.indrelid AND t.relname = wanted.tbl \
         WHERE NOT EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = c.oid)",
    )
    .bind(&names)
    .bind(&tables)
    .fetch_all(&mut **conn)
    .await?;
    for row in leftovers {
        let name: String = row.get(0);
        tracing::warn!(index = %name, "an earlier build of this index died before its migration was recorded: \
            dropping it to build it again");
        let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS \"{}\"", name.replace('"', "\"\""));
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop)).execute(&mut **conn).await?;
    }
    Ok(())
}

/// The indexes `sql` creates `CONCURRENTLY`, with their tables (`CREATE [UNIQUE] INDEX CONCURRENTLY [IF NOT
/// EXISTS] name ON [ONLY] table`), comments skipped.
fn concurrent_indexes(sql: &str) -> Vec<(String, String)> {
    let code: String = sql.lines().map(|l| l.split("--").next().unwrap_or("")).collect::<Vec<_>>().join(" ");
    let words: Vec<&str> = code.split_whitespace().collect();
    let is = |at: usize, word: &str| words.get(at).is_some_and(|w| w.eq_ignore_ascii_case(word));
    let unquoted = |w: &str| w.trim_matches('"').to_owned();
    let mut found = Vec::new();
    for at in 1..words.len() {
        if !(is(at, "concurrently") && is(at - 1, "index")) {
            continue;
        }
        let mut name = at + 1;
        if is(name, "if") {
            name += 3;
        }
        let mut table = name + 2;
        if !is(name + 1, "on") {
            continue;
        }
        if is(table, "only") {
            table += 1;
        }
        if let (Some(n), Some(t)) = (words.get(name), words.get(table)) {
            // A table named with its columns attached (`t(x)`) still names `t`.
            let t = t.split('(').next().unwrap_or(t);
            found.push((unquoted(n), unquoted(t)));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::concurrent_indexes;

    fn pairs(sql: &str) -> Vec<(String, String)> {
        concurrent_indexes(sql)
    }

    #[test]
    fn the_indexes_built_concurrently_and_their_tables() {
        let sql = "-- no-transaction\n-- CREATE INDEX CONCURRENTLY not_me ON t (x);\n\
                   CREATE INDEX CONCURRENTLY IF NOT EXISTS tokens_retention ON idempotency_tokens\n    (state);";
        assert_eq!(pairs(sql), [("tokens_retention".to_owned(), "idempotency_tokens".to_owned())]);
        let sql = "CREATE UNIQUE INDEX CONCURRENTLY \"a\" ON ONLY t(x)";
        assert_eq!(pairs(sql), [("a".to_owned(), "t".to_owned())]);
        assert!(pairs("CREATE INDEX a ON t (x); ALTER TABLE t ADD COLUMN c int").is_empty());
    }
}
