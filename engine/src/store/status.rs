//! The states a workflow, a step and a compensation go through: one enum each, stored as its text (see
//! [`crate::stored_as_text!`]) and written as the same text in JSON.

use serde::{Deserialize, Serialize};

/// A workflow's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    /// Running forward, or waiting to run (see `next_attempt_at` and the lease).
    Running,
    /// A step failed terminally (or the workflow was cancelled); compensations are running.
    Compensating,
    /// Finished with an output.
    Completed,
    /// Failed; every registered compensation has run.
    Failed,
    /// Failed, and a compensation could not finish: an operator must look.
    CompensationFailed,
    /// Cancelled by an operator; every registered compensation has run.
    Cancelled,
}

impl WorkflowState {
    /// Every state a workflow can be in.
    pub const ALL: [Self; 6] =
        [Self::Running, Self::Compensating, Self::Completed, Self::Failed, Self::CompensationFailed, Self::Cancelled];

    /// The states whose workflows the retention pass deletes once their history retention has passed since
    /// they ended (`updated_at`). Not `compensation_failed`: such a workflow waits for an operator (a refund
    /// that did not happen, say), so it is unfinished work and is kept until an operator's retry ends it.
    /// Nor a `failed` one with a compensation still `registered`: a step mismatch stops a workflow without
    /// undoing anything (a payment's order stays `paying`, its charge unresolved), and it too waits for an
    /// operator's retry. Any other `failed` one may still be retried by an operator while it is kept: the
    /// retention is that window.
    pub const DELETABLE: [Self; 3] = [Self::Completed, Self::Failed, Self::Cancelled];

    /// Whether a workflow in this state will not change again without an operator.
    pub const fn is_final(self) -> bool {
        !matches!(self, Self::Running | Self::Compensating)
    }
}

/// What a step does, which decides how it is replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Runs inside the workflow's transaction.
    Transactional,
    /// A call outside the database: intent committed before, outcome after.
    External,
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Intent committed, no outcome yet: if met on resume, the outcome is unknown.
    Started,
    /// The last attempt's outcome is unknown; the next attempt must resolve it.
    Unknown,
    /// The last attempt failed retryably; the next attempt waits for `next_attempt_at`.
    Retrying,
    /// Finished with an output.
    Completed,
    /// Failed terminally.
    Failed,
}

/// Where a registered compensation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationStatus {
    /// Registered; runs if the workflow fails.
    Registered,
    /// Has run to completion.
    Done,
    /// Failed terminally.
    Failed,
}

crate::stored_as_text! {
    WorkflowState {
        Running = "running",
        Compensating = "compensating",
        Completed = "completed",
        Failed = "failed",
        CompensationFailed = "compensation_failed",
        Cancelled = "cancelled",
    }
    StepKind { Transactional = "transactional", External = "external" }
    StepStatus { Started = "started", Unknown = "unknown", Retrying = "retrying", Completed = "completed", Failed = "failed" }
    CompensationStatus { Registered = "registered", Done = "done", Failed = "failed" }
}

#[cfg(test)]
mod tests {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::Serialize;
    use serde::de::DeserializeOwned;

    use super::*;

    /// Each value's text is its JSON string and parses back to it.
    fn agree<T>(values: &[T], texts: &[&str])
    where
        T: Copy + PartialEq + std::fmt::Debug + Display + FromStr + Serialize + DeserializeOwned,
        T::Err: std::fmt::Debug,
    {
        assert_eq!(values.len(), texts.len());
        for (value, text) in values.iter().zip(texts) {
            assert_eq!(value.to_string(), *text);
            assert_eq!(text.parse::<T>().unwrap(), *value);
            assert_eq!(serde_json::to_string(value).unwrap(), format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<T>(&format!("\"{text}\"")).unwrap(), *value);
        }
        assert!("Running".parse::<T>().is_err() && "".parse::<T>().is_err());
    }

    #[test]
    fn text_and_serde_agree_for_every_value() {
        let states = ["running", "compensating", "completed", "failed", "compensation_failed", "cancelled"];
        agree(&WorkflowState::ALL, &states);
        agree(&[StepKind::Transactional, StepKind::External], &["transactional", "external"]);
        let steps =
            [StepStatus::Started, StepStatus::Unknown, StepStatus::Retrying, StepStatus::Completed, StepStatus::Failed];
        agree(&steps, &["started", "unknown", "retrying", "completed", "failed"]);
        let comps = [CompensationStatus::Registered, CompensationStatus::Done, CompensationStatus::Failed];
        agree(&comps, &["registered", "done", "failed"]);
    }

    #[test]
    fn only_running_and_compensating_are_unfinished() {
        let unfinished: Vec<_> = WorkflowState::ALL.into_iter().filter(|s| !s.is_final()).collect();
        assert_eq!(unfinished, [WorkflowState::Running, WorkflowState::Compensating]);
        assert!(WorkflowState::DELETABLE.iter().all(|s| s.is_final()));
        assert!(!WorkflowState::DELETABLE.contains(&WorkflowState::CompensationFailed));
    }
}
