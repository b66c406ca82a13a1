//! The engine against the plain-SQL floor, on the same Postgres in the same run.
//!
//! `DATABASE_URL=postgres://… cargo bench -p onceflow-tests --bench engine [-- --workflows N --concurrency C]`
//!
//! Measures `../shared/bench/floor_pay.pgbench` with `pgbench` (16 clients), then a five-step workflow doing the
//! same writes — three transactional steps in one atomic phase, one external no-op step, one transactional
//! step — with 16 workflows in flight, and prints both rates and their ratio.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use onceflow_engine::{BoxFuture, Engine, Interrupt, Outcome, PgStore, Store, Workflow, WorkflowContext};
use onceflow_tests::baseline::{fresh_db, pgbench, run};

struct Pay;

impl Workflow<PgStore> for Pay {
    const NAME: &'static str = "bench_pay";
    type Input = i64;
    type Output = ();

    async fn run(&self, ctx: &mut WorkflowContext<PgStore>, n: i64) -> Result<(), Interrupt> {
        let (token, order, request) = (format!("tok{n}"), format!("ord{n}"), format!("req{n}"));
        let t = token.clone();
        ctx.transactional("claim_token", move |c| -> BoxFuture<'_, _> {
            Box::pin(async move {
                sqlx::query("UPDATE idempotent_requests SET request_hash = $2 WHERE token = $1 AND status = 0")
                    .bind(t)
                    .bind("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
                    .execute(c)
                    .await?;
                Ok(())
            })
        })
        .await?;
        let (o, r) = (order.clone(), request.clone());
        ctx.transactional("insert_record", move |c| -> BoxFuture<'_, _> {
            Box::pin(async move {
                sqlx::query("INSERT INTO pay_records (order_no, request_no, amount, status) VALUES ($1, $2, 100, 1)")
                    .bind(o)
                    .bind(r)
                    .execute(c)
                    .await?;
                Ok(())
            })
        })
        .await?;
        let o = order.clone();
        ctx.transactional("reserve_status", move |c| -> BoxFuture<'_, _> {
            Box::pin(async move {
                sqlx::query(
                    "UPDATE pay_orders SET status = 1, version = version + 1 WHERE order_no = $1 AND status = 0",
                )
                .bind(o)
                .execute(c)
                .await?;
                Ok(())
            })
        })
        .await?;
        ctx.external("call_channel", |_attempt| async { Ok(()) }).await?;
        ctx.transactional("confirm", move |c| -> BoxFuture<'_, _> {
            Box::pin(async move {
                sqlx::query("UPDATE pay_orders SET status = 2 WHERE order_no = $1 AND status = 1")
                    .bind(&order)
                    .execute(&mut *c)
                    .await?;
                sqlx::query("UPDATE idempotent_requests SET status = 1, response_body = $2 WHERE token = $1")
                    .bind(&token)
                    .bind(format!("{{\"order_no\":\"{order}\",\"status\":\"PAID\"}}"))
                    .execute(&mut *c)
                    .await?;
                Ok(())
            })
        })
        .await
    }
}

async fn commits(store: &PgStore) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(store.pool())
        .await?)
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let Ok(base) = std::env::var("DATABASE_URL") else {
        println!("skipped: set DATABASE_URL=postgres://… to run the engine benchmark");
        return Ok(());
    };
    if !base.starts_with("postgres") {
        println!("skipped: the engine benchmark runs on Postgres");
        return Ok(());
    }
    let concurrency = arg("--concurrency", 16);
    let workflows = arg("--workflows", 16_000);
    let floor_tx = arg("--floor-transactions", 1000);

    println!("floor: pgbench -n -c {concurrency} -j 2 -t {floor_tx} -f floor_pay.pgbench");
    let floor_tps = pgbench(&base, "floor_pay.pgbench", concurrency, floor_tx)?;
    println!("floor: {floor_tps:.0} payments/s");

    let engine_url = fresh_db(&base, "onceflow_bench_engine")?;
    let schema = onceflow_tests::baseline::bench_dir().join("schema.sql");
    run(std::process::Command::new("psql")
        .arg(&engine_url)
        .args(["-q", "-v", &format!("n={workflows}"), "-f"])
        .arg(schema))?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let rate = rt.block_on(async move {
        let store = PgStore::connect(&engine_url, u32::try_from(concurrency).unwrap_or(16) + 4).await?;
        store.migrate().await?;
        let engine = Engine::builder(store).register(Pay).build();
        let commits_before = commits(engine.store()).await?;
        let next = Arc::new(AtomicU64::new(1));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..concurrency {
            let (engine, next) = (engine.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n > workflows {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let handle = engine.start::<Pay>(&format!("pay-{n}"), &(n as i64)).await?;
                    let outcome = handle.wait(Duration::from_secs(30)).await?;
                    anyhow::ensure!(matches!(outcome, Some(Outcome::Completed(_))), "workflow {n}: {outcome:?}");
                }
            }));
        }
        for task in tasks {
            task.await??;
        }
        let secs = started.elapsed().as_secs_f64();
        // Statistics reach pg_stat_database within a second or so.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let commits = commits(engine.store()).await? - commits_before;
        println!(
            "engine: {:.2} commits per workflow (pg_stat_database.xact_commit)",
            commits as f64 / workflows as f64
        );
        let paid: i64 = sqlx::query_scalar("SELECT count(*) FROM pay_orders WHERE status = 2")
            .fetch_one(engine.store().pool())
            .await?;
        anyhow::ensure!(paid == workflows as i64, "{paid} orders paid of {workflows}");
        Ok::<_, anyhow::Error>(workflows as f64 / secs)
    })?;
    println!("engine: {workflows} five-step workflows, {concurrency} in flight: {rate:.0} workflows/s");
    println!("ratio engine/floor: {:.2}x", rate / floor_tps);
    Ok(())
}
