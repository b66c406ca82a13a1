//! `bytes/postgres` (issue 34): what a payment leaves in Postgres. `count` payments through the service as a
//! library on a fresh database (seeded with an order and a token each, as `library/postgres`), then every table's
//! size — heap, indexes, TOAST, and their total (`pg_total_relation_size`) — divided by the payments made, and
//! the rate of the first and the last fifth of them (at most 40,000 each), to show whether it holds as the tables
//! grow.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use onceflow_engine::PgStore;
use onceflow_payments::PaymentStore;
use onceflow_tests::baseline::fresh_db;

use super::library::{commit_slots, pay, service};
use super::measure::{Run, drive};
use super::options::Options;
use super::seed::seed_pg;

/// Every table of the database with its sizes in bytes: heap (main fork), indexes, TOAST (with its index), total.
const SIZES: &str = "SELECT c.relname::text, pg_relation_size(c.oid), pg_indexes_size(c.oid), \
     COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0), pg_total_relation_size(c.oid) \
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
     ORDER BY pg_total_relation_size(c.oid) DESC, c.relname";

/// Every index of the database with its table and size in bytes.
const INDEXES: &str = "SELECT t.relname::text, i.relname::text, pg_relation_size(i.oid) \
     FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid \
     JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') \
     AND t.relkind = 'r' ORDER BY pg_relation_size(i.oid) DESC, i.relname";

/// The payments of the first and the last window of a run: a fifth of them, at most 40,000.
fn window(done: usize) -> usize {
    (done / 5).clamp(1, 40_000)
}

/// `bytes/postgres`: pays `o.count` orders, then prints bytes per payment by table.
pub(crate) async fn postgres(base: &str, pool_size: u32, o: &Options) -> anyhow::Result<Run> {
    let url = fresh_db(base, "onceflow_bench_bytes")?;
    let store = PgStore::connect(&url, pool_size).await?.group_commit(commit_slots()?);
    store.migrate_payments().await?;
    seed_pg(&url, o.count).await?;
    let payments = service(store);
    let finished = Arc::new(Mutex::new(Vec::with_capacity(usize::try_from(o.count).unwrap_or(0))));
    let started = Instant::now();
    let times = finished.clone();
    let run = drive("bytes/postgres", o, move |n| {
        let (payments, times) = (payments.clone(), times.clone());
        async move {
            pay(&payments, n).await?;
            times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(Instant::now());
            Ok(())
        }
    })
    .await?;

    let times = finished.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    let w = window(times.len());
    if let (Some(first), Some(last_start), Some(last)) =
        (times.get(w - 1), times.len().checked_sub(w + 1), times.last())
    {
        let first_rate = w as f64 / first.duration_since(started).as_secs_f64();
        let last_rate = w as f64 / last.duration_since(times[last_start]).as_secs_f64();
        eprintln!(
            "bytes/postgres: first {w} payments {first_rate:.0}/s, last {w} {last_rate:.0}/s (last/first {:.2})",
            last_rate / first_rate
        );
    }

    let pool = sqlx::PgPool::connect(&url).await?;
    let paid: i64 =
        sqlx::query_scalar("SELECT count(*) FROM payments WHERE status = 'succeeded'").fetch_one(&pool).await?;
    let sizes: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(SIZES).fetch_all(&pool).await?;
    let per = |bytes: i64| bytes as f64 / paid.max(1) as f64;
    println!();
    println!("bytes per payment on Postgres after {paid} payments (pg_total_relation_size of every table / payments)");
    println!("{:<28} {:>9} {:>9} {:>9} {:>9}", "table", "heap", "indexes", "toast", "total");
    let mut total = (0, 0, 0, 0);
    for (table, heap, indexes, toast, all) in &sizes {
        if *all >= 8192 * 2 {
            println!("{table:<28} {:>9.0} {:>9.0} {:>9.0} {:>9.0}", per(*heap), per(*indexes), per(*toast), per(*all));
        }
        total = (total.0 + heap, total.1 + indexes, total.2 + toast, total.3 + all);
    }
    println!(
        "{:<28} {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
        "all tables",
        per(total.0),
        per(total.1),
        per(total.2),
        per(total.3)
    );
    let indexes: Vec<(String, String, i64)> = sqlx::query_as(INDEXES).fetch_all(&pool).await?;
    println!("{:<28} {:<32} {:>9}", "table", "index", "bytes");
    for (table, index, bytes) in indexes.iter().filter(|(_, _, bytes)| *bytes >= 8192 * 2) {
        println!("{table:<28} {index:<32} {:>9.0}", per(*bytes));
    }
    Ok(run)
}
