//! A deadlock between two workflows' transactions is not a failure: the database undoes the victim's phase, the
//! engine replays it, and each step's effect commits once. The step allows a single attempt, so the test
//! fails if a replay after a deadlock were counted as one (the workflow would end `retries_exhausted`).
//! Postgres and MySQL only: SQLite serializes writers, so its transactions cannot cross.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use onceflow_engine::{BoxFuture, Engine, Interrupt, Outcome, RetryPolicy, StepError, Workflow, WorkflowContext, step};
use onceflow_tests::TestDb;
use tokio::sync::Barrier;

/// Touches `locks` row `first`, meets the other workflow, then touches `second`: two of them, in opposite
/// orders, each wait for the other's row.
struct Crossing {
    barrier: Arc<Barrier>,
    arrivals: Arc<AtomicUsize>,
}

impl<S: TestDb> Workflow<S> for Crossing {
    const NAME: &'static str = "crossing";
    type Input = (i32, i32);
    type Output = ();

    async fn run(&self, ctx: &mut WorkflowContext<S>, (first, second): (i32, i32)) -> Result<(), Interrupt> {
        let id = ctx.workflow_id().to_owned();
        let (barrier, arrivals) = (self.barrier.clone(), self.arrivals.clone());
        let once = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
        ctx.transactional(step("cross").retry(once), move |conn| -> BoxFuture<'_, Result<(), StepError>> {
            Box::pin(async move {
                S::touch(conn, first).await?;
                // Only the first two runs meet: a replay goes straight on.
                if arrivals.fetch_add(1, Ordering::SeqCst) < 2 {
                    barrier.wait().await;
                }
                S::touch(conn, second).await?;
                S::effect(conn, id, "cross".to_owned()).await
            })
        })
        .await
    }
}

async fn a_deadlock_is_replayed_not_failed<S: TestDb>(store: S) {
    store.create_locks().await.unwrap();
    let engine = Engine::builder(store.clone())
        .register(Crossing { barrier: Arc::new(Barrier::new(2)), arrivals: Arc::new(AtomicUsize::new(0)) })
        .build();
    let (one, two) = (engine.clone(), engine.clone());
    let a = tokio::spawn(async move { one.start::<Crossing>("cross-12", &(1, 2)).await.map(|_| ()) });
    let b = tokio::spawn(async move { two.start::<Crossing>("cross-21", &(2, 1)).await.map(|_| ()) });
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    for id in ["cross-12", "cross-21"] {
        let outcome = engine.wait(id, Duration::from_secs(30)).await.unwrap();
        assert!(matches!(outcome, Some(Outcome::Completed(_))), "{id}: {outcome:?}");
        // The victim's first run (its touches and its effect) was undone with its transaction.
        assert_eq!(store.effects(id).await.unwrap(), ["cross"], "{id}");
    }
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_is_replayed_not_failed_on_postgres() {
    let Some(store) = onceflow_tests::pg_store().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    a_deadlock_is_replayed_not_failed(store).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_is_replayed_not_failed_on_mysql() {
    let Some(store) = onceflow_tests::mysql_store().await.unwrap() else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    a_deadlock_is_replayed_not_failed(store).await;
}
