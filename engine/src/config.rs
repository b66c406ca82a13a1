//! How an engine is tuned: leases, polling, waits, concurrency.

use std::time::Duration;

/// Tuning of leases, polling and waits.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How long a claimed workflow is owned without a heartbeat.
    pub lease: Duration,
    /// How often the recovery loop looks for due workflows, and waiters poll the database.
    pub poll_interval: Duration,
    /// Retry waits up to this long are slept in-process; longer ones are persisted and the workflow released.
    pub max_inline_wait: Duration,
    /// Most workflows the recovery loop runs at once in this process.
    pub max_concurrent: usize,
    /// How old the workflow counts by state may be before a read of them (`Engine::workflow_counts`, for
    /// metrics) starts a new count: at most one scan of the workflow table per interval, whatever the scrape
    /// rate, and none in a process that is never scraped.
    pub count_interval: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
            max_inline_wait: Duration::from_secs(2),
            max_concurrent: 64,
            count_interval: Duration::from_secs(60),
        }
    }
}
