//! How long what is kept, is kept: the retention settings that the service (a token's lifetime) and the
//! retention pass (what it deletes when) both read.

use std::time::Duration;

/// How long what is kept, is kept (`contracts/cli.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// An unused token expires this long after it was issued (`--token-ttl`, 24 h).
    pub token_ttl: Duration,
    /// A used token and its stored response are kept this long after the payment ended
    /// (`--response-retention`, 7 d).
    pub response_retention: Duration,
    /// A finished workflow and its steps are kept this long after it ended (`--history-retention`, 30 d).
    pub history_retention: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 24 * 60 * 60;
        Self {
            token_ttl: Duration::from_secs(DAY),
            response_retention: Duration::from_secs(7 * DAY),
            history_retention: Duration::from_secs(30 * DAY),
        }
    }
}

/// `d` in milliseconds.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
