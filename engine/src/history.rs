//! Deleting finished workflows' histories: what the retention pass asks of the engine, one batch at a time.

use crate::engine::Engine;
use crate::error::Result;
use crate::store::{Deleted, Store};

impl<S: Store> Engine<S> {
    /// Now, by the engine's clock (ms since the epoch): the time a retention pass measures ages against, so
    /// that tests with a manual clock see the same time as the workflows they ran.
    pub fn now_ms(&self) -> i64 {
        self.core.now()
    }

    /// Deletes one batch of at most `limit` finished workflows that ended at or before `ended_by` (ms), with their
    /// steps, in one short transaction: `completed`, `failed` and `cancelled` ones (see
    /// [`crate::store::WorkflowState::DELETABLE`]); running, compensating and `compensation_failed` workflows are never
    /// deleted, nor a `failed` one that a step mismatch stopped with nothing undone. Call it until it deletes fewer
    /// than `limit`.
    pub async fn delete_finished_before(&self, ended_by: i64, limit: i64) -> Result<Deleted> {
        self.core.store.delete_finished(ended_by, limit.max(1)).await
    }

    /// What [`Engine::delete_finished_before`] would delete, in all its batches (a dry run).
    pub async fn count_finished_before(&self, ended_by: i64) -> Result<Deleted> {
        self.core.store.count_finished(ended_by).await
    }
}
