//! The databases the scenarios pay in: `count` pending orders `o1..` and unused tokens `tok1..` for tenant
//! `default` on each backend, a fresh MySQL database, and an SQLite one removed afterwards.

use onceflow_tests::baseline::checkpoint;

/// `count` pending orders `o1..` and unused tokens `tok1..` for tenant `default`.
const SEED_SQL: [&str; 2] = [
    "INSERT INTO orders (tenant, order_no, amount, currency, status, version, created_at, updated_at) \
     SELECT 'default', 'o' || g, 1000, 'CNY', 'pending', 0, 0, 0 FROM generate_series(1, $1) g",
    "INSERT INTO idempotency_tokens (token, tenant, state, created_at, expires_at, updated_at) \
     SELECT 'tok' || g, 'default', 'issued', 0, 9000000000000, 0 FROM generate_series(1, $1) g",
];

pub(crate) async fn seed_pg(url: &str, count: u64) -> anyhow::Result<()> {
    let pool = sqlx::PgPool::connect(url).await?;
    for sql in SEED_SQL {
        sqlx::query(sql).bind(i64::try_from(count)?).execute(&pool).await?;
    }
    // As the baselines' `schema.sql` does after loading: the seeded rows then read as they would in a database
    // that had been running (visibility known, statistics gathered) instead of freshly bulk-loaded; and a
    // checkpoint, as before each baseline run.
    sqlx::query("VACUUM ANALYZE").execute(&pool).await?;
    checkpoint(url)?;
    Ok(())
}

pub(crate) async fn seed_sqlite(url: &str, count: u64) -> anyhow::Result<()> {
    let pool = sqlx::SqlitePool::connect(url).await?;
    let mut tx = pool.begin().await?;
    for n in 1..=count {
        sqlx::query(
            "INSERT INTO orders (tenant, order_no, amount, currency, status, version, created_at, updated_at) \
             VALUES ('default', $1, 1000, 'CNY', 'pending', 0, 0, 0)",
        )
        .bind(format!("o{n}"))
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO idempotency_tokens (token, tenant, state, created_at, expires_at, updated_at) VALUES ($1, 'default', 'issued', 0, 9000000000000, 0)")
            .bind(format!("tok{n}"))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// `count` pending orders and unused tokens on MySQL, in batches (MySQL has no `generate_series`).
pub(crate) async fn seed_mysql(url: &str, count: u64) -> anyhow::Result<()> {
    let pool = sqlx::MySqlPool::connect(url).await?;
    let mut n = 1;
    while n <= count {
        let last = (n + 999).min(count);
        let (mut orders, mut tokens) = (Vec::new(), Vec::new());
        for i in n..=last {
            orders.push(format!("('default', 'o{i}', 1000, 'CNY', 'pending', 0, 0, 0)"));
            tokens.push(format!("('tok{i}', 'default', 'issued', 0, 9000000000000, 0)"));
        }
        let orders = format!(
            "INSERT INTO orders (tenant, order_no, amount, currency, status, version, created_at, updated_at) VALUES {}",
            orders.join(", ")
        );
        let tokens = format!(
            "INSERT INTO idempotency_tokens (token, tenant, state, created_at, expires_at, updated_at) VALUES {}",
            tokens.join(", ")
        );
        sqlx::query(sqlx::AssertSqlSafe(orders)).execute(&pool).await?;
        sqlx::query(sqlx::AssertSqlSafe(tokens)).execute(&pool).await?;
        n = last + 1;
    }
    Ok(())
}

/// A fresh MySQL database `name` on `base`'s server; returns its URL.
pub(crate) async fn fresh_mysql_db(base: &str, name: &str) -> anyhow::Result<String> {
    let pool = sqlx::MySqlPool::connect(base).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}"))).execute(&pool).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&pool).await?;
    let server = base.rsplit_once('/').map_or(base, |(s, _)| s);
    Ok(format!("{server}/{name}"))
}

/// Removes an SQLite database and its WAL files.
pub(crate) fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
