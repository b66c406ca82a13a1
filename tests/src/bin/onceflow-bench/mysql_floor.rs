//! `floor_pay/mysql`: the plain-SQL floor of `../shared/bench/floor_pay.pgbench` on MySQL / MariaDB, so that the
//! MySQL scenarios have a yardstick from the same server and the same run, as the Postgres ones have pgbench's.
//!
//! The same three tables as `schema.sql` (in MySQL form, InnoDB) with `count` pending orders and unused tokens, and
//! per payment the same two transactions of the same statements as `floor_pay.pgbench`, the values bound instead
//! of concatenated (`||` is `OR` in MySQL). There is no pgbench for MySQL: `concurrency` tasks of this process drive
//! it, each client task with a connection of its own (prepared statements, as onceflow's own).

use std::sync::{Arc, Mutex};

use sqlx::{Connection, Executor, MySqlConnection};

use super::measure::{Run, drive};
use super::options::Options;
use super::seed::fresh_mysql_db;

/// `schema.sql`'s tables in MySQL form.
const SCHEMA: [&str; 3] = [
    "CREATE TABLE pay_orders (
       id BIGINT AUTO_INCREMENT PRIMARY KEY,
       order_no VARCHAR(64) NOT NULL UNIQUE,
       amount BIGINT NOT NULL,
       status SMALLINT NOT NULL,
       version INT NOT NULL DEFAULT 0,
       updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
     ) ENGINE = InnoDB",
    "CREATE TABLE pay_records (
       id BIGINT AUTO_INCREMENT PRIMARY KEY,
       order_no VARCHAR(64) NOT NULL,
       request_no VARCHAR(64) NOT NULL UNIQUE,
       amount BIGINT NOT NULL,
       status SMALLINT NOT NULL,
       INDEX idx_order_no (order_no)
     ) ENGINE = InnoDB",
    "CREATE TABLE idempotent_requests (
       id BIGINT AUTO_INCREMENT PRIMARY KEY,
       token VARCHAR(80) NOT NULL UNIQUE,
       request_hash CHAR(64) NOT NULL DEFAULT '',
       status SMALLINT NOT NULL,
       response_body TEXT NULL,
       created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
     ) ENGINE = InnoDB",
];

/// `floor_pay.pgbench`'s first transaction: claim the token, insert the record, reserve the order.
const PHASE_ONE: [&str; 3] = [
    "UPDATE idempotent_requests SET request_hash = \
     'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' WHERE token = ? AND status = 0",
    "INSERT INTO pay_records (order_no, request_no, amount, status) VALUES (?, ?, 100, 1)",
    "UPDATE pay_orders SET status = 1, version = version + 1 WHERE order_no = ? AND status = 0",
];

/// Its second: confirm the order, store the response.
const PHASE_TWO: [&str; 2] = [
    "UPDATE pay_orders SET status = 2 WHERE order_no = ? AND status = 1",
    "UPDATE idempotent_requests SET status = 1, response_body = ? WHERE token = ?",
];

/// Payments per second of the floor on a fresh database `onceflow_bench_floor` of `base`'s MySQL server.
pub(crate) async fn run(base: &str, o: &Options) -> anyhow::Result<Run> {
    let url = fresh_mysql_db(base, "onceflow_bench_floor").await?;
    let mut setup = MySqlConnection::connect(&url).await?;
    for sql in SCHEMA {
        setup.execute(sql).await?;
    }
    seed(&mut setup, o.count).await?;
    setup.close().await?;
    // A connection per client, as pgbench has: no pool, so no ping as each goes back to it.
    let mut clients = Vec::new();
    for _ in 0..o.concurrency {
        clients.push(MySqlConnection::connect(&url).await?);
    }
    let clients = Arc::new(Mutex::new(clients));
    drive("floor_pay/mysql", o, move |n| {
        let clients = clients.clone();
        async move {
            let idle = clients.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.pop();
            let mut conn = idle.ok_or_else(|| anyhow::anyhow!("more payments in flight than clients"))?;
            pay(&mut conn, n).await?;
            clients.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(conn);
            Ok(())
        }
    })
    .await
}

/// Pending orders `ord1..ordN` and unused tokens `tok1..tokN`, as `schema.sql` makes them.
async fn seed(conn: &mut MySqlConnection, count: u64) -> anyhow::Result<()> {
    let mut n = 1;
    while n <= count {
        let last = (n + 999).min(count);
        let orders: Vec<String> = (n..=last).map(|i| format!("('ord{i}', 100, 0)")).collect();
        let tokens: Vec<String> = (n..=last).map(|i| format!("('tok{i}', 0)")).collect();
        let orders = format!("INSERT INTO pay_orders (order_no, amount, status) VALUES {}", orders.join(", "));
        let tokens = format!("INSERT INTO idempotent_requests (token, status) VALUES {}", tokens.join(", "));
        conn.execute(sqlx::AssertSqlSafe(orders)).await?;
        conn.execute(sqlx::AssertSqlSafe(tokens)).await?;
        n = last + 1;
    }
    conn.execute("ANALYZE TABLE pay_orders, pay_records, idempotent_requests").await?;
    Ok(())
}

/// Payment `n`: the floor's two transactions, each checked to have done its work.
async fn pay(conn: &mut MySqlConnection, n: u64) -> anyhow::Result<()> {
    let (order, token) = (format!("ord{n}"), format!("tok{n}"));
    let mut tx = conn.begin().await?;
    let claimed = sqlx::query(PHASE_ONE[0]).bind(&token).execute(&mut *tx).await?;
    sqlx::query(PHASE_ONE[1]).bind(&order).bind(format!("req{n}")).execute(&mut *tx).await?;
    let reserved = sqlx::query(PHASE_ONE[2]).bind(&order).execute(&mut *tx).await?;
    tx.commit().await?;
    anyhow::ensure!(claimed.rows_affected() == 1 && reserved.rows_affected() == 1, "floor payment {n}: not seeded");
    let mut tx = conn.begin().await?;
    sqlx::query(PHASE_TWO[0]).bind(&order).execute(&mut *tx).await?;
    let body = format!(r#"{{"order_no":"{order}","status":"PAID"}}"#);
    sqlx::query(PHASE_TWO[1]).bind(body).bind(&token).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}
