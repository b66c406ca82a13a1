//! The `library/…` scenarios: payments through the service as a library, the engine, the saga and the
//! in-process mock channel, with no HTTP in between.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::store::DEFAULT_COMMIT_SLOTS;
use onceflow_engine::{EngineConfig, PgStore};
use onceflow_payments::{MockChannel, PaymentRequest, PaymentStore, Payments, Token};
use onceflow_tests::baseline::fresh_db;
use onceflow_tests::ids::pay_request;

use super::measure::{Run, drive};
use super::options::Options;
use super::seed::seed_pg;

fn request(n: u64) -> PaymentRequest {
    pay_request(format!("o{n}"), 1000, None)
}

/// The service as a library over `store`: the engine, the saga and the in-process mock channel.
pub(crate) fn service<S: PaymentStore>(store: S) -> Payments<S> {
    Payments::new(store, Arc::new(MockChannel::reliable()), EngineConfig::default())
}

/// Pays seeded order `n` with seeded token `n`, and checks it was charged.
pub(crate) async fn pay<S: PaymentStore>(payments: &Payments<S>, n: u64) -> anyhow::Result<()> {
    let r = payments
        .pay("default", &Token::parse(format!("tok{n}"))?, "/v1/payments", &request(n), Duration::from_secs(30))
        .await?;
    anyhow::ensure!(r.status == 201, "payment {n}: {} {}", r.status, r.body);
    Ok(())
}

/// Payments through the service as a library: the engine, the saga and the in-process mock channel.
pub(crate) async fn run<S: PaymentStore>(name: &'static str, store: S, o: &Options) -> anyhow::Result<Run> {
    let payments = service(store);
    drive(name, o, move |n| {
        let payments = payments.clone();
        async move { pay(&payments, n).await }
    })
    .await
}

/// The group commit's slots for the library scenarios on Postgres: `ONCEFLOW_COMMIT_SLOTS`, as `serve` reads it
/// (so that one setting compares both), else the store's default.
pub(crate) fn commit_slots() -> anyhow::Result<usize> {
    match std::env::var("ONCEFLOW_COMMIT_SLOTS") {
        Ok(v) => v.parse().map_err(|_| anyhow::anyhow!("ONCEFLOW_COMMIT_SLOTS={v:?} is not a number")),
        Err(_) => Ok(DEFAULT_COMMIT_SLOTS),
    }
}

/// The payment service as a library on a fresh Postgres database.
pub(crate) async fn postgres(base: &str, pool_size: u32, o: &Options) -> anyhow::Result<Run> {
    let url = fresh_db(base, "onceflow_bench_library")?;
    let store = PgStore::connect(&url, pool_size).await?.group_commit(commit_slots()?);
    store.migrate_payments().await?;
    seed_pg(&url, o.count).await?;
    match o.gc_every {
        Some(every) => super::retention::run(store, &url, every, o).await,
        None => run("library/postgres", store, o).await,
    }
}
