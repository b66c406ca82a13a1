//! How a finished workflow ended, as waiters receive it.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::Failure;
use crate::error::parse_failure;
use crate::store::{WorkflowRecord, WorkflowState};

/// The end of a workflow.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Finished with this output.
    Completed(Value),
    /// Failed; every registered compensation ran.
    Failed(Failure),
    /// Failed, and a compensation could not finish: an operator must look.
    CompensationFailed(Failure),
    /// Cancelled by an operator; every registered compensation ran.
    Cancelled(Failure),
}

impl Outcome {
    /// The outcome of a workflow in a final state; `None` while it is still running.
    pub fn from_record(record: &WorkflowRecord) -> Option<Self> {
        let failure = || parse_failure(record.error.as_deref());
        Some(match record.state {
            WorkflowState::Completed => Self::Completed(
                record.output.as_deref().and_then(|o| serde_json::from_str(o).ok()).unwrap_or(Value::Null),
            ),
            WorkflowState::Failed => Self::Failed(failure()),
            WorkflowState::CompensationFailed => Self::CompensationFailed(failure()),
            WorkflowState::Cancelled => Self::Cancelled(failure()),
            WorkflowState::Running | WorkflowState::Compensating => return None,
        })
    }

    /// The output decoded as `T`, or the failure.
    pub fn output<T: DeserializeOwned>(&self) -> Result<T, Failure> {
        match self {
            Self::Completed(v) => {
                T::deserialize(v).map_err(|e| Failure::new("invalid_output", format!("output does not decode: {e}")))
            }
            Self::Failed(f) | Self::CompensationFailed(f) | Self::Cancelled(f) => Err(f.clone()),
        }
    }
}
