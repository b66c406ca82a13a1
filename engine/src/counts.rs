//! Workflow counts by state for metrics, kept by the engine: read from memory, so a scrape never scans the
//! workflow table, however often it comes. A read of counts older than
//! [`EngineConfig::count_interval`](crate::EngineConfig) (or of none yet) starts one count in the background and
//! answers with what it has: a process that is never scraped never counts, and one that is counts at most once
//! per interval (one `GROUP BY` over the table), whatever the scrape rate.
//!
//! Each process counts the whole table (not its own workflows): several processes report the same numbers, each
//! up to about one interval old, so aggregate them with `max` (or `avg`), never `sum`. A count that fails (the
//! database is down) keeps the last one, whose time says how old it is; the next read tries again.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use crate::core::millis;
use crate::engine::Engine;
use crate::error::Result;
use crate::store::{Store, WorkflowState};

/// How many workflows were in each state, when last counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowCounts {
    /// Every state ([`WorkflowState::ALL`]) with its count (0 when none are in it).
    pub by_state: Vec<(WorkflowState, i64)>,
    /// When they were counted (ms since the epoch, the engine's clock).
    pub counted_at: i64,
}

impl<S: Store> Engine<S> {
    /// The last counts (`None` until a first count succeeded), without a query; when they are older than
    /// `count_interval`, a count starts in the background (one at a time) for the next read. Call it inside a
    /// Tokio runtime.
    pub fn workflow_counts(&self) -> Option<WorkflowCounts> {
        let last = self.core.counts.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let interval = millis(self.core.config.count_interval);
        let stale = last.as_ref().is_none_or(|c| self.core.now() - c.counted_at >= interval);
        if stale && !self.core.counting.swap(true, Ordering::AcqRel) {
            // Cleared however the count ends (a panic included, or a task dropped unpolled at shutdown), or no count
            // would ever start again.
            struct Counting<S: Store>(Engine<S>);
            impl<S: Store> Drop for Counting<S> {
                fn drop(&mut self) {
                    self.0.core.counting.store(false, Ordering::Release);
                }
            }
            let counting = Counting(self.clone());
            tokio::spawn(async move {
                if let Err(e) = counting.0.refresh_counts().await {
                    tracing::warn!(error = %e, "counting workflows by state failed");
                }
            });
        }
        last
    }

    /// Counts the workflows by state now (one `GROUP BY` over the table), keeping the result for
    /// [`Engine::workflow_counts`].
    pub async fn refresh_counts(&self) -> Result<WorkflowCounts> {
        let counted = self.core.store.count_by_state().await?;
        let by_state = WorkflowState::ALL
            .into_iter()
            .map(|s| (s, counted.iter().find(|(c, _)| *c == s).map_or(0, |(_, n)| *n)))
            .collect();
        let counts = WorkflowCounts { by_state, counted_at: self.core.now() };
        *self.core.counts.lock().unwrap_or_else(PoisonError::into_inner) = Some(counts.clone());
        Ok(counts)
    }
}
