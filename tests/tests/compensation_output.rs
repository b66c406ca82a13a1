//! `WorkflowContext::compensation_output`, on SQLite, Postgres and MySQL: a compensation learns what a step of
//! an earlier compensation returned (they run in the reverse order of their forward steps) — also when its body
//! is replayed from the database after a retryable failure — and `None` for a forward step without a
//! compensation or a step that compensation never ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use onceflow_engine::{
    BoxFuture, Compensation, Engine, Failure, Interrupt, Outcome, StepError, Workflow, WorkflowContext, step,
};
use onceflow_tests::{TestDb, effect_step, on_every_backend};

/// `x` and `y` (each with a compensation), an external step (their commit), then a terminal failure. The
/// compensation of `y` runs first: an external `give_back` answering 42. That of `x` then records what it
/// learns of it, failing once (retryable) first, so that it reads it again in a replayed body.
struct Told {
    attempts: Arc<AtomicU32>,
}

impl<S: TestDb> Workflow<S> for Told {
    const NAME: &'static str = "told";
    type Input = ();
    type Output = ();

    async fn run(&self, ctx: &mut WorkflowContext<S>, _: ()) -> Result<(), Interrupt> {
        let id = ctx.workflow_id().to_owned();
        ctx.transactional(step("x").compensate_with("first", ()), effect_step::<S>(id.clone(), "x")).await?;
        ctx.transactional(step("y").compensate_with("second", ()), effect_step::<S>(id, "y")).await?;
        ctx.external("e", |_| async { Ok(()) }).await?;
        ctx.transactional("boom", |_| -> BoxFuture<'_, Result<(), StepError>> {
            Box::pin(async { Err(StepError::Terminal(Failure::new("boom", "the test asked for a failure"))) })
        })
        .await
    }

    async fn compensate(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &Compensation,
        _failure: &Failure,
    ) -> Result<(), Interrupt> {
        let id = ctx.workflow_id().to_owned();
        if compensation.name == "second" {
            ctx.external("give_back", |_| async { Ok(42_u32) }).await?;
            return ctx.transactional("undo", effect_step::<S>(id, "undo:y")).await;
        }
        let seen = ctx.compensation_output::<u32>("y", "give_back");
        let unknown = ctx.compensation_output::<u32>("e", "give_back");
        let never_ran = ctx.compensation_output::<u32>("y", "never");
        let what = format!("first saw {seen:?} {unknown:?} {never_ran:?}");
        let attempts = self.attempts.clone();
        ctx.transactional("undo", move |conn| -> BoxFuture<'_, Result<(), StepError>> {
            Box::pin(async move {
                if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(StepError::Retryable("once".into()));
                }
                S::effect(conn, id, what).await
            })
        })
        .await
    }
}

async fn a_compensation_learns_what_an_earlier_one_returned<S: TestDb>(store: S) {
    let attempts = Arc::new(AtomicU32::new(0));
    let engine = Engine::builder(store.clone()).register(Told { attempts: attempts.clone() }).build();
    let outcome = engine.start::<Told>("told", &()).await.unwrap().wait(Duration::from_secs(20)).await.unwrap();
    assert!(matches!(outcome, Some(Outcome::Failed(_))), "{outcome:?}");
    assert_eq!(store.effects("told").await.unwrap(), ["x", "y", "undo:y", "first saw Some(42) None None"]);
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "the reading compensation was replayed once");
}

on_every_backend!(a_compensation_learns_what_an_earlier_one_returned);
