//! onceflow's payment benchmark, every figure against the plain-SQL baselines measured in the same run.
//!
//! ```sh
//! cargo build --release --workspace
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres target/release/onceflow-bench --concurrency 16 --count 8000
//! ```
//!
//! Scenarios: `seed_pay` and `floor_pay` with pgbench; the payment service as a library on Postgres (in-process
//! mock channel, zero latency) on Postgres and on SQLite; `onceflow serve` over HTTP on Postgres and on embedded
//! SQLite (with its peak RSS), and on each 1,000 concurrent requests with one token. With `MYSQL_URL=mysql://…` set (a user who may
//! `CREATE DATABASE`), the library and HTTP scenarios also run on MySQL / MariaDB, each also against
//! `floor_pay/mysql`, `floor_pay`'s statements on the same MySQL server in the same run. `mq/postgres`: payment
//! commands through `onceflow consume` on a RabbitMQ broker (`AMQP_URL`, default the local guest one).
//! `refunds/postgres`: refunds through the service as a library, each refunding a paid payment whole, beside
//! `library/postgres`'s payments of the same run (`--only library/postgres,refunds/postgres`).
//! `notify/postgres`: signed channel notifications posted to `onceflow serve` on Postgres while it takes the
//! HTTP payment load, with the payment rate of the same window and of a run without notifications.
//! `events/postgres`: the HTTP payment load on Postgres without a webhook endpoint and with one subscribed (a
//! receiver in the bench), then every event checked in the log and at the receiver (`--only events`).
//! `tracing/postgres`: the HTTP payment load on Postgres without tracing and exporting it over OTLP/HTTP to a
//! receiver in the bench (`--only tracing`). `bytes/postgres`: payments through the service as a library, then
//! every table's bytes per payment and the rate of the first and last payments (only when named: `--only bytes`).

use onceflow_engine::{MySqlStore, SqliteStore};
use onceflow_payments::PaymentStore;
use onceflow_tests::baseline::{fresh_db, pgbench};

#[path = "onceflow-bench/bytes.rs"]
mod bytes;
#[path = "onceflow-bench/events.rs"]
mod events;
#[path = "onceflow-bench/http.rs"]
mod http;
#[path = "onceflow-bench/library.rs"]
mod library;
#[path = "onceflow-bench/measure.rs"]
mod measure;
#[path = "onceflow-bench/mq.rs"]
mod mq;
#[path = "onceflow-bench/mysql_floor.rs"]
mod mysql_floor;
#[path = "onceflow-bench/notify.rs"]
mod notify;
#[path = "onceflow-bench/options.rs"]
mod options;
#[path = "onceflow-bench/receiver.rs"]
mod receiver;
#[path = "onceflow-bench/refunds.rs"]
mod refunds;
#[path = "onceflow-bench/report.rs"]
mod report;
#[path = "onceflow-bench/retention.rs"]
mod retention;
#[path = "onceflow-bench/seed.rs"]
mod seed;
#[path = "onceflow-bench/tracing.rs"]
mod tracing;

use seed::{fresh_mysql_db, remove_sqlite, seed_mysql, seed_pg, seed_sqlite};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = options::parse()?;
    let base = std::env::var("DATABASE_URL")
        .map_err(|_| anyhow::anyhow!("set DATABASE_URL=postgres://… (a database whose user may CREATE DATABASE)"))?;
    let per_client = (o.count / o.concurrency).max(1);
    eprintln!("baselines: pgbench -c {} -t {per_client} (seed_pay, floor_pay)", o.concurrency);
    let seed = pgbench(&base, "seed_pay.pgbench", o.concurrency, per_client)?;
    let floor = pgbench(&base, "floor_pay.pgbench", o.concurrency, per_client)?;
    eprintln!("  seed_pay {seed:.0}/s, floor_pay {floor:.0}/s");

    let pool_size = match o.pool {
        Some(pool) => pool,
        None => u32::try_from(o.concurrency)? + 4,
    };
    let mut runs = Vec::new();
    let mut paired = Vec::new();
    if o.wants("library/postgres") {
        let run = library::postgres(&base, pool_size, &o).await?;
        paired.push(run.rate() / floor);
        runs.push(run);
        for round in 2..=o.rounds {
            eprintln!("paired round {round}/{}: floor_pay, then library/postgres", o.rounds);
            let floor = pgbench(&base, "floor_pay.pgbench", o.concurrency, per_client)?;
            paired.push(library::postgres(&base, pool_size, &o).await?.rate() / floor);
        }
    }

    if o.asks("bytes/postgres") {
        runs.push(bytes::postgres(&base, pool_size, &o).await?);
    }

    if o.wants("refunds/postgres") {
        runs.push(refunds::postgres(&base, pool_size, &o).await?);
    }

    let mut stormed = Vec::new();
    if o.wants("http/postgres") {
        let pg_url = fresh_db(&base, "onceflow_bench_http")?;
        let pg = http::serve(&pg_url).await?;
        seed_pg(&pg_url, o.count).await?;
        runs.push(http::run("http/postgres", &pg, &o).await?);
        stormed.push(("Postgres", http::storm(&pg, &o).await?));
    }

    let mut notified = None;
    if o.wants("notify/postgres") {
        let n = notify::postgres(&base, &o).await?;
        notified = Some((n.notifications, n.loaded.rate(), n.solo.rate()));
        runs.push(n.solo);
        runs.push(n.loaded);
    }

    let mut evented = None;
    if o.wants("events/postgres") {
        let e = events::postgres(&base, &o).await?;
        evented = Some((e.checked, e.with.rate(), e.without.rate()));
        runs.push(e.without);
        runs.push(e.with);
    }

    let mut traced = None;
    if o.wants("tracing/postgres") {
        let t = tracing::postgres(&base, &o).await?;
        traced = Some((t.exports, t.with.rate(), t.without.rate()));
        runs.push(t.without);
        runs.push(t.with);
    }

    if o.wants("mq/postgres") {
        let amqp = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
        let pg_url = fresh_db(&base, "onceflow_bench_mq")?;
        let consumer = mq::start(&amqp, &pg_url).await?;
        seed_pg(&pg_url, o.count).await?;
        runs.push(mq::run("mq/postgres", &consumer, &o).await?);
        consumer.finish().await;
    }

    if o.wants("library/sqlite") {
        let path = std::env::temp_dir().join(format!("onceflow-bench-lib-{}.db", std::process::id()));
        let url = format!("sqlite://{}", path.display());
        let store = SqliteStore::connect(&url).await?;
        store.migrate_payments().await?;
        seed_sqlite(&url, o.count).await?;
        runs.push(library::run("library/sqlite", store, &o).await?);
        remove_sqlite(&path);
    }

    if o.wants("http/sqlite") {
        let path = std::env::temp_dir().join(format!("onceflow-bench-{}.db", std::process::id()));
        let sqlite_url = format!("sqlite://{}", path.display());
        let sqlite = http::serve(&sqlite_url).await?;
        seed_sqlite(&sqlite_url, o.count).await?;
        runs.push(http::run("http/sqlite", &sqlite, &o).await?);
        stormed.push(("SQLite", http::storm(&sqlite, &o).await?));
        drop(sqlite);
        remove_sqlite(&path);
    }

    let (mut floor_mysql, mut mysql_rates) = (None, Vec::new());
    match std::env::var("MYSQL_URL") {
        Ok(mysql_base) => {
            let mut on_mysql = Vec::new();
            if o.wants("library/mysql") || o.wants("http/mysql") {
                eprintln!("baseline: floor_pay's statements on MySQL, {} clients", o.concurrency);
                let floor = mysql_floor::run(&mysql_base, &o).await?;
                floor_mysql = Some(floor.rate());
                runs.push(floor);
            }
            if o.wants("library/mysql") {
                let url = fresh_mysql_db(&mysql_base, "onceflow_bench_library").await?;
                let store = MySqlStore::connect(&url, pool_size).await?;
                store.migrate_payments().await?;
                seed_mysql(&url, o.count).await?;
                on_mysql.push(library::run("library/mysql", store, &o).await?);
            }
            if o.wants("http/mysql") {
                let url = fresh_mysql_db(&mysql_base, "onceflow_bench_http").await?;
                let server = http::serve(&url).await?;
                seed_mysql(&url, o.count).await?;
                on_mysql.push(http::run("http/mysql", &server, &o).await?);
            }
            mysql_rates = on_mysql.iter().map(|r| (r.name, r.rate())).collect();
            runs.extend(on_mysql);
        }
        Err(_) => eprintln!("MYSQL_URL is not set: no MySQL scenarios"),
    }

    report::table(&runs, seed, floor);
    report::paired(paired);
    if let Some(floor) = floor_mysql {
        report::mysql(&mysql_rates, floor);
    }
    report::storms(stormed, o.storm);
    if let Some((notifications, paid, solo)) = notified {
        report::notifications(&notifications, paid, solo);
    }
    if let Some((checked, with, without)) = evented {
        report::events(&checked, with, without);
    }
    if let Some((exports, with, without)) = traced {
        report::tracing(&exports, with, without);
    }
    Ok(())
}
