//! How a step is described to the context, and what an attempt is told about the attempts before it.

use std::future::Future;
use std::pin::Pin;

use serde::Serialize;
use serde_json::Value;

use crate::retry::RetryPolicy;

/// A step's key, name, retry policy and compensation.
///
/// `&str` converts into a spec whose name is its key and whose retry policy is the default.
#[derive(Debug, Clone)]
pub struct StepSpec {
    pub(crate) key: String,
    pub(crate) name: String,
    pub(crate) retry: RetryPolicy,
    /// The waits after a [`crate::StepError::Pending`] attempt; the retry policy's when `None`.
    pub(crate) pending: Option<RetryPolicy>,
    pub(crate) compensation: Option<(String, Value)>,
}

/// A step under `key` (unique within its workflow), named after its key.
pub fn step(key: impl Into<String>) -> StepSpec {
    let key = key.into();
    StepSpec { name: key.clone(), key, retry: RetryPolicy::default(), pending: None, compensation: None }
}

impl StepSpec {
    /// Names what the step does when its key is not that name (`poll:3` named `poll`).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The retry policy for this step's retryable failures.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The schedule of an external step's attempts while the outside is still deciding
    /// ([`crate::StepError::Pending`]): its waits may grow long (minutes, an hour), since an event from outside
    /// wakes the workflow when the outside decides. Its `max_attempts` does not apply: a pending outcome is
    /// never given up. Without it, the retry policy's waits.
    pub fn pending_retry(mut self, policy: RetryPolicy) -> Self {
        self.pending = Some(policy);
        self
    }

    /// Registers the workflow's compensation `name` with `input`, durably with the step: a transactional step's
    /// once it has returned (in its phase's commit, rolled back with it), an external step's with the intent of
    /// its first attempt, before the call. It runs if the workflow later fails, and only if the step left a row;
    /// it is told the step's output ([`crate::Compensation::forward`]) so that it undoes exactly what the step
    /// did.
    pub fn compensate_with(mut self, name: impl Into<String>, input: impl Serialize) -> Self {
        let input = serde_json::to_value(input).unwrap_or(Value::Null);
        self.compensation = Some((name.into(), input));
        self
    }
}

impl From<&str> for StepSpec {
    fn from(key: &str) -> Self {
        step(key)
    }
}

impl From<String> for StepSpec {
    fn from(key: String) -> Self {
        step(key)
    }
}

/// What an external step's attempt knows about the attempts before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Previous {
    /// This is the first attempt.
    None,
    /// An earlier attempt may have had its effect: the process died during it, or it ended with an unknown
    /// outcome. Find out what happened before acting again.
    Unknown,
    /// An earlier attempt failed retryably with this message; nothing happened.
    Failed(String),
}

/// One attempt of an external step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt, counting attempts in earlier processes too.
    pub number: u32,
    /// What the attempts before this one left behind.
    pub previous: Previous,
}

/// A boxed, sendable future: what transactional step closures return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
