//! Workflow types: what a caller implements, and the type-erased form the engine keeps in its registry.

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::WorkflowContext;
use crate::error::{Failure, Interrupt};
use crate::step::BoxFuture;
use crate::store::Store;

/// A registered compensation, as handed to [`Workflow::compensate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Compensation {
    /// The forward step it undoes.
    pub step_key: String,
    /// Which compensation to run.
    pub name: String,
    /// The input given at registration.
    pub input: Value,
    /// The forward step's stored output, once it completed (`None` while only an external step's intent is
    /// recorded). A compensation runs only for a forward step that left a row; this tells it what that step
    /// did, so that it undoes exactly that (a step that wrote nothing needs nothing undone).
    pub forward: Option<Value>,
}

/// A workflow type: a name, a JSON input, a JSON output and a body made of durable steps.
pub trait Workflow<S: Store>: Send + Sync + 'static {
    /// The registered name, stored with every instance.
    const NAME: &'static str;
    /// The input; its JSON is hashed to recognise a repeated start.
    type Input: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// The output.
    type Output: Serialize + DeserializeOwned + Send + 'static;

    /// The tenant the workflow belongs to, stored in its row (`workflows.tenant`) so that lists filter by it in
    /// the query. Read once, at the start; the default is none.
    fn tenant(input: &Self::Input) -> Option<String> {
        let _ = input;
        None
    }

    /// The body. It is replayed from the start after a crash or a wait: steps that finished return their
    /// stored output, so everything outside steps must be deterministic.
    fn run(
        &self,
        ctx: &mut WorkflowContext<S>,
        input: Self::Input,
    ) -> impl Future<Output = Result<Self::Output, Interrupt>> + Send;

    /// Runs one registered compensation after `failure`. Steps run here through `ctx` are durable like any
    /// other (their keys are kept apart from the forward steps'). The default does nothing.
    fn compensate(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &Compensation,
        failure: &Failure,
    ) -> impl Future<Output = Result<(), Interrupt>> + Send {
        let _ = (ctx, compensation, failure);
        async { Ok(()) }
    }
}

/// A [`Workflow`] with its types erased to JSON, as the registry keeps it.
pub(crate) trait ErasedWorkflow<S: Store>: Send + Sync {
    fn run<'a>(&'a self, ctx: &'a mut WorkflowContext<S>, input: &'a str) -> BoxFuture<'a, Result<String, Interrupt>>;

    fn compensate<'a>(
        &'a self,
        ctx: &'a mut WorkflowContext<S>,
        compensation: &'a Compensation,
        failure: &'a Failure,
    ) -> BoxFuture<'a, Result<(), Interrupt>>;
}

impl<S: Store, W: Workflow<S>> ErasedWorkflow<S> for W {
    fn run<'a>(&'a self, ctx: &'a mut WorkflowContext<S>, input: &'a str) -> BoxFuture<'a, Result<String, Interrupt>> {
        Box::pin(async move {
            let input: W::Input = serde_json::from_str(input).map_err(|e| {
                Interrupt::Failed(Failure::new("invalid_input", format!("stored input does not decode: {e}")))
            })?;
            let output = Workflow::run(self, ctx, input).await?;
            serde_json::to_string(&output).map_err(|e| Interrupt::Engine(e.into()))
        })
    }

    fn compensate<'a>(
        &'a self,
        ctx: &'a mut WorkflowContext<S>,
        compensation: &'a Compensation,
        failure: &'a Failure,
    ) -> BoxFuture<'a, Result<(), Interrupt>> {
        Box::pin(Workflow::compensate(self, ctx, compensation, failure))
    }
}
