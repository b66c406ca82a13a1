//! Time as the engine sees it: milliseconds since the Unix epoch, injectable for tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// Whether the database's clock judges leases rather than this one (`true` unless a clock says otherwise).
    /// A lease is shared by every process on the database; judged by each process's own clock, one whose clock
    /// ran ahead by more than a lease would take every live workflow of the others, and one whose clock ran
    /// behind would lose its own. So the database's clock (Postgres `clock_timestamp()`, MySQL `NOW(3)`, SQLite
    /// the clock of its one process) decides when a lease ends. A clock the database cannot see — a manual
    /// clock that tests move past a lease — judges its own leases.
    fn leases_by_database(&self) -> bool {
        true
    }
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to: for tests of leases and retry waits.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self(Arc::new(AtomicI64::new(now_ms)))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }

    /// The database cannot see this clock: leases are judged by it, so that moving it expires them.
    fn leases_by_database(&self) -> bool {
        false
    }
}
