//! A worker process for the crash tests: runs the `steps` test workflow to completion, or stops at a chosen
//! point and prints `reached <point>` so the test can kill it there with SIGKILL.
//!
//! `crash-worker <database-url> <workflow-id> <lease-ms> [stop-point]`

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::{Engine, EngineConfig, MySqlStore, PgStore, SqliteStore};
use onceflow_tests::{Hooks, Steps, StepsInput, TestDb};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, id, lease_ms, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: crash-worker <database-url> <workflow-id> <lease-ms> [stop-point]");
    };
    let lease = Duration::from_millis(lease_ms.parse()?);
    let stop = rest.first().cloned();
    if url.starts_with("postgres") {
        run(PgStore::connect(url, 4).await?, id, lease, stop).await
    } else if url.starts_with("mysql") {
        run(MySqlStore::connect(url, 4).await?, id, lease, stop).await
    } else {
        run(SqliteStore::connect(url).await?, id, lease, stop).await
    }
}

async fn run<S: TestDb>(store: S, id: &str, lease: Duration, stop: Option<String>) -> anyhow::Result<()> {
    store.migrate().await?;
    store.create_effects().await?;
    let hooks = Arc::new(Hooks::default());
    if let Some(point) = stop {
        let mut reached = hooks.stop_at(&point).await;
        tokio::spawn(async move {
            if let Some(point) = reached.recv().await {
                println!("reached {point}");
                let _ = std::io::stdout().flush();
            }
        });
    }
    let config = EngineConfig { lease, poll_interval: Duration::from_millis(50), ..EngineConfig::default() };
    let engine = Engine::builder(store).register(Steps { hooks }).config(config).build();
    let _background = engine.spawn_background();
    let input = StepsInput { label: "x".to_owned(), fail: false };
    let handle = engine.start::<Steps>(id, &input).await?;
    let outcome = handle.wait(Duration::from_secs(60)).await?;
    println!("outcome {outcome:?}");
    engine.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}
