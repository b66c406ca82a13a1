//! Retry policies: how long to wait before the next attempt, and when to give up.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Exponential backoff with a cap, a limit on attempts and optional jitter.
///
/// The waits themselves are computed by `backon`; whether a wait is slept in-process or persisted as the
/// workflow's `next_attempt_at` is the engine's choice (see [`crate::EngineConfig::max_inline_wait`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Wait after the first failed attempt.
    pub initial_interval: Duration,
    /// Factor applied to the wait after each further failure.
    pub multiplier: f32,
    /// Largest wait between two attempts.
    pub max_interval: Duration,
    /// Attempts in all, the first included. A retryable error after the last attempt is terminal.
    pub max_attempts: u32,
    /// Adds a random part (up to the wait itself) so that many workflows do not retry in lockstep.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial_interval: Duration::from_millis(100),
            multiplier: 2.0,
            max_interval: Duration::from_secs(60),
            max_attempts: 10,
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn none() -> Self {
        Self { max_attempts: 1, ..Self::default() }
    }

    /// The wait before attempt `failed_attempts + 1`, or `None` when the attempts are used up.
    pub fn delay_after(&self, failed_attempts: u32) -> Option<Duration> {
        if failed_attempts >= self.max_attempts {
            return None;
        }
        self.backoff_delay(failed_attempts)
    }

    /// The wait after `failed_attempts` failures ignoring `max_attempts` (capped at `max_interval`): used for
    /// outcomes that must be resolved however long it takes.
    pub fn delay_unbounded(&self, failed_attempts: u32) -> Duration {
        self.backoff_delay(failed_attempts.min(64)).unwrap_or(self.max_interval)
    }

    fn backoff_delay(&self, failed_attempts: u32) -> Option<Duration> {
        let mut builder = ExponentialBuilder::default()
            .with_min_delay(self.initial_interval)
            .with_factor(self.multiplier.max(1.0))
            .with_max_delay(self.max_interval)
            .with_max_times(failed_attempts.max(1) as usize);
        if self.jitter {
            builder = builder.with_jitter();
        }
        let n = failed_attempts.max(1) as usize;
        // backon multiplies in f32: whole milliseconds keep the waits exact.
        let whole_ms = |d: Duration| Duration::from_millis((d.as_secs_f64() * 1000.0).round() as u64);
        builder.build().nth(n - 1).map(|d| whole_ms(d).min(self.max_interval * 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_and_stop_at_max_attempts() {
        let p = RetryPolicy {
            initial_interval: Duration::from_millis(10),
            multiplier: 2.0,
            max_interval: Duration::from_millis(50),
            max_attempts: 4,
            jitter: false,
        };
        assert_eq!(p.delay_after(1), Some(Duration::from_millis(10)));
        assert_eq!(p.delay_after(2), Some(Duration::from_millis(20)));
        assert_eq!(p.delay_after(3), Some(Duration::from_millis(40)));
        assert_eq!(p.delay_after(4), None);
        assert_eq!(p.delay_unbounded(30), Duration::from_millis(50));
    }
}
