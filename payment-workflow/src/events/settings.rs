//! How events are kept and delivered: the flags of `contracts/cli.md` (`--event-retention`,
//! `--webhook-allow-http`, `--webhook-allow-private`, `--webhook-retry-schedule`) and what tests shorten.

use std::sync::Arc;
use std::time::Duration;

use super::address::{Resolver, Rules, SystemResolver};

/// The contract's retry schedule: the waits between a failed delivery's attempts (about 28 h in all).
pub const DEFAULT_SCHEDULE: [Duration; 7] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
];

/// How events are kept and delivered.
#[derive(Clone)]
pub struct EventSettings {
    /// Events (with their delivery records) are kept this long, and longer while a delivery is pending
    /// (`--event-retention`, 30 d).
    pub retention: Duration,
    /// Where endpoints may point (`--webhook-allow-http`, `--webhook-allow-private`).
    pub rules: Rules,
    /// The waits between a failed delivery's attempts; its length is the number of retries
    /// (`--webhook-retry-schedule`).
    pub schedule: Vec<Duration>,
    /// An attempt not answered `2xx` within this is failed (15 s).
    pub timeout: Duration,
    /// Attempts in flight at once to one endpoint, per process, once it has answered `2xx` there (one until
    /// then, and while its attempts fail: see `slots.rs`).
    pub per_endpoint: usize,
    /// How often the dispatcher and the delivery loop look for work when idle.
    pub poll: Duration,
    /// How host names are resolved, at registration and at every connection.
    pub resolver: Arc<dyn Resolver>,
}

impl std::fmt::Debug for EventSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSettings")
            .field("retention", &self.retention)
            .field("rules", &self.rules)
            .field("schedule", &self.schedule)
            .field("timeout", &self.timeout)
            .field("per_endpoint", &self.per_endpoint)
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

impl Default for EventSettings {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(30 * 24 * 3600),
            rules: Rules::default(),
            schedule: DEFAULT_SCHEDULE.to_vec(),
            timeout: Duration::from_secs(15),
            per_endpoint: 4,
            poll: Duration::from_millis(250),
            resolver: Arc::new(SystemResolver),
        }
    }
}

impl EventSettings {
    /// The schedule as a delivery stores it: its waits in ms, comma-separated.
    pub fn stored_schedule(&self) -> String {
        self.schedule.iter().map(|d| d.as_millis().to_string()).collect::<Vec<_>>().join(",")
    }

    /// How long a claimed attempt is held before another process may take the delivery again: longer than any
    /// attempt can take (the timeout), so one attempt is never sent twice at once.
    pub fn lease(&self) -> Duration {
        self.timeout + Duration::from_secs(5)
    }
}

/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The wait after attempt `attempt` (1, 2, …) failed under the stored `schedule`, with jitter (±10 %, from
/// `unit`, a number in [0, 1)); `None` when the schedule is spent.
pub fn wait_after(schedule: &str, attempt: i32, unit: f64) -> Option<Duration> {
    let waits: Vec<u64> = schedule.split(',').filter_map(|w| w.trim().parse().ok()).collect();
    let base = *waits.get(usize::try_from(attempt).ok()?.checked_sub(1)?)?;
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let jittered = (base as f64 * (0.9 + 0.2 * unit.clamp(0.0, 1.0))) as u64;
    Some(Duration::from_millis(jittered))
}

/// The wait after attempt `attempt` failed, its answer asking to wait `retry_after` (`429`, `503`): the
/// schedule's, or `retry_after` (at most [`MAX_RETRY_AFTER`]) when that is longer. Never shorter than the
/// schedule: every attempt counts against it, so a short `Retry-After` that replaced it would spend a
/// delivery's whole schedule in seconds. `None` when the schedule is spent.
pub fn retry_wait(schedule: &str, attempt: i32, unit: f64, retry_after: Option<Duration>) -> Option<Duration> {
    let wait = wait_after(schedule, attempt, unit)?;
    Some(retry_after.map_or(wait, |asked| wait.max(asked.min(MAX_RETRY_AFTER))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_schedule_gives_each_wait_with_jitter_then_none() {
        let settings = EventSettings::default();
        let stored = settings.stored_schedule();
        assert_eq!(stored, "5000,300000,1800000,7200000,18000000,36000000,36000000");
        assert_eq!(wait_after(&stored, 1, 0.5), Some(Duration::from_secs(5)));
        assert_eq!(wait_after(&stored, 7, 0.0), Some(Duration::from_secs(9 * 3600)));
        assert_eq!(wait_after(&stored, 7, 1.0), Some(Duration::from_secs(11 * 3600)));
        assert_eq!(wait_after(&stored, 8, 0.5), None, "eight attempts in all");
        assert_eq!(wait_after("", 1, 0.5), None);
        let second = Duration::from_secs(1);
        assert_eq!(retry_wait(&stored, 1, 0.5, Some(second)), Some(Duration::from_secs(5)), "the schedule's, longer");
        assert_eq!(retry_wait(&stored, 1, 0.5, Some(60 * second)), Some(60 * second), "Retry-After's, longer");
        assert_eq!(retry_wait(&stored, 1, 0.5, Some(Duration::MAX)), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_wait(&stored, 8, 0.5, Some(second)), None, "the schedule is spent");
        let total: Duration = DEFAULT_SCHEDULE.iter().sum();
        assert!((27..=33).contains(&(total.as_secs() / 3600)), "about 28 h: {total:?}");
    }
}
