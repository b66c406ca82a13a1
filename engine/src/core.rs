//! What every run of one engine shares: the store, the clock and configuration, the workflows this process
//! drives now (which the heartbeat extends), and the waiters of each workflow.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, OnceCell, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::EngineConfig;
use crate::error::{Error, Result, TRANSIENT_RETRY_MS, is_transient};
use crate::outcome::Outcome;
use crate::store::{Lease, Store};

/// How a start learns whether its workflow was recorded: `Ok(true)` recorded by this start, `Ok(false)` the
/// id was recorded by another start first.
pub(crate) type StartSignal = oneshot::Sender<Result<bool>>;

/// How a run of this process ended: its outcome, and the input hash of the workflow it drove.
pub(crate) struct Ended {
    pub(crate) outcome: Outcome,
    pub(crate) input_hash: String,
}

/// What a waiter hears: `Some(ended)` from a run of this process, `None` for "stopped without an outcome (or
/// ended elsewhere): read it".
pub(crate) type Heard = Option<Option<Arc<Ended>>>;

/// The waiters of one workflow, woken together when it ends.
pub(crate) struct Waiters {
    pub(crate) tx: watch::Sender<Heard>,
    pub(crate) count: usize,
}

/// A workflow a task of this process drives now.
pub(crate) struct Driven {
    /// Which run drives it: only that run's end takes the workflow out of [`Core::running`] (an older run of the
    /// same id, fenced and still unwinding when this process claimed the workflow again, must not).
    pub(crate) run: u64,
    /// Its input hash, which a start of the same id attaches by.
    pub(crate) input_hash: String,
    /// Told by [`crate::Engine::wake`]: the run's wait before its next attempt ends at once (a wake while no wait
    /// is under way ends the next one).
    pub(crate) woken: Arc<Notify>,
}

/// What every running workflow of one engine shares.
pub(crate) struct Core<S: Store> {
    pub(crate) store: S,
    pub(crate) config: EngineConfig,
    pub(crate) shutdown: CancellationToken,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) owner: String,
    /// Workflows a live task of this process drives now: the only ones its heartbeat extends.
    pub(crate) running: Mutex<HashMap<String, Driven>>,
    /// The token of the next run (see [`Driven::run`]).
    pub(crate) next_run: AtomicU64,
    pub(crate) waiters: Mutex<HashMap<String, Waiters>>,
    /// Whether this store forwards other processes' notifications (decided once, by `Store::listen`).
    pub(crate) listener: OnceCell<bool>,
    /// The last workflow counts by state (`counts.rs`).
    pub(crate) counts: Mutex<Option<crate::counts::WorkflowCounts>>,
    /// Whether a count is under way.
    pub(crate) counting: std::sync::atomic::AtomicBool,
}

impl<S: Store> Core<S> {
    /// The shared state of a new engine over `store` (its lease owner id fresh).
    pub(crate) fn new(store: S, config: EngineConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            config,
            shutdown: CancellationToken::new(),
            clock,
            owner: uuid::Uuid::new_v4().to_string(),
            running: Mutex::new(HashMap::new()),
            next_run: AtomicU64::new(1),
            waiters: Mutex::new(HashMap::new()),
            listener: OnceCell::new(),
            counts: Mutex::new(None),
            counting: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Extends the leases of the workflows a live task of this process drives (a run that stopped, however,
    /// lets its lease expire, so that any process resumes it); a deadlock or lock timeout is tried again at
    /// once, a few times (the lease would otherwise wait a whole heartbeat period closer to its end).
    pub(crate) async fn heartbeat(&self) -> Result<u64> {
        let ids: Vec<String> = self.running().keys().cloned().collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let mut tries = 0;
        loop {
            match self.store.heartbeat(&self.owner, &ids, self.lease()).await {
                // A pool that timed out is as passing as a deadlock: the lease is lost if this gives up.
                Err(Error::Database(e))
                    if (is_transient(&e) || matches!(e, sqlx::Error::PoolTimedOut)) && tries < 3 =>
                {
                    tries += 1
                }
                done => return done,
            }
            tokio::time::sleep(Duration::from_millis(TRANSIENT_RETRY_MS * tries)).await;
        }
    }

    pub(crate) fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// A lease of the configured length from now, judged by the database's clock unless the engine's clock says
    /// it judges its own (see [`Clock::leases_by_database`]).
    pub(crate) fn lease(&self) -> Lease {
        Lease { now: self.now(), length_ms: millis(self.config.lease), by_database: self.clock.leases_by_database() }
    }

    pub(crate) fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Driven>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that a new run drives `workflow_id` (replacing an older run's entry); returns the run's token.
    pub(crate) fn drive_here(
        running: &mut HashMap<String, Driven>,
        next_run: &AtomicU64,
        workflow_id: &str,
        hash: &str,
    ) -> u64 {
        let run = next_run.fetch_add(1, Ordering::Relaxed);
        let woken = Arc::new(Notify::new());
        running.insert(workflow_id.to_owned(), Driven { run, input_hash: hash.to_owned(), woken });
        run
    }

    /// The wake of the run that drives `workflow_id` here, if one does.
    pub(crate) fn woken(&self, workflow_id: &str) -> Option<Arc<Notify>> {
        self.running().get(workflow_id).map(|d| d.woken.clone())
    }

    /// Run `run` of `workflow_id` ended: the workflow is no longer driven here, unless a newer run drives it.
    pub(crate) fn forget_running(&self, workflow_id: &str, run: u64) {
        let mut running = self.running();
        if running.get(workflow_id).is_some_and(|d| d.run == run) {
            running.remove(workflow_id);
        }
    }

    /// Wakes the waiters of `workflow_id` (only them).
    pub(crate) fn announce(&self, workflow_id: &str, ended: Option<Arc<Ended>>) {
        let waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = waiters.get(workflow_id) {
            w.tx.send_replace(Some(ended));
        }
    }

    pub(crate) fn subscribe(self: &Arc<Self>, workflow_id: &str) -> Subscription<S> {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let entry =
            waiters.entry(workflow_id.to_owned()).or_insert_with(|| Waiters { tx: watch::Sender::new(None), count: 0 });
        entry.count += 1;
        Subscription { core: self.clone(), workflow_id: workflow_id.to_owned(), rx: entry.tx.subscribe() }
    }
}

/// One waiter's registration; dropping it forgets the waiter.
pub(crate) struct Subscription<S: Store> {
    pub(crate) core: Arc<Core<S>>,
    pub(crate) workflow_id: String,
    pub(crate) rx: watch::Receiver<Heard>,
}

impl<S: Store> Drop for Subscription<S> {
    fn drop(&mut self) {
        let mut waiters = self.core.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = waiters.get_mut(&self.workflow_id) {
            w.count -= 1;
            if w.count == 0 {
                waiters.remove(&self.workflow_id);
            }
        }
    }
}

/// Until `woken` (if any) is told; forever without one.
pub(crate) async fn woken(woken: Option<Arc<Notify>>) {
    match woken {
        Some(w) => w.notified().await,
        None => std::future::pending().await,
    }
}

/// `d` in milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)
}
