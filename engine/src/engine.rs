//! The engine: a registry of workflow types, starting and attaching, waiting for results, the recovery loop
//! with its heartbeat, operator actions and graceful shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::{OnceCell, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::context::failure_json;
use crate::error::{Error, Failure, Result, TRANSIENT_RETRY_MS, is_transient};
use crate::outcome::Outcome;
use crate::run::drive;
use crate::store::{CompensationRecord, Reopen, StepRecord, Store, WorkflowRecord, state};
use crate::workflow::{ErasedWorkflow, Workflow};

/// The failure code of an operator's cancel.
pub const CANCELLED_CODE: &str = "cancelled";

/// How a start learns whether its workflow was recorded: `Ok(true)` recorded by this start, `Ok(false)` the
/// id was recorded by another start first.
pub(crate) type StartSignal = oneshot::Sender<Result<bool>>;

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
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
            max_inline_wait: Duration::from_secs(2),
            max_concurrent: 64,
        }
    }
}

/// What a waiter hears: `Some(outcome)` from this process, `None` for "ended elsewhere, read it".
type Heard = Option<Option<Arc<Outcome>>>;

/// The waiters of one workflow, woken together when it ends.
struct Waiters {
    tx: watch::Sender<Heard>,
    count: usize,
}

/// A workflow a task of this process drives now.
struct Driven {
    /// Which run drives it: only that run's end takes the workflow out of [`Core::running`] (an older run of the
    /// same id, fenced and still unwinding when this process claimed the workflow again, must not).
    run: u64,
    /// Its input hash, which a start of the same id attaches by.
    input_hash: String,
}

/// What every running workflow of one engine shares.
pub(crate) struct Core<S: Store> {
    pub(crate) store: S,
    pub(crate) config: EngineConfig,
    pub(crate) shutdown: CancellationToken,
    clock: Arc<dyn Clock>,
    owner: String,
    registry: HashMap<&'static str, Arc<dyn ErasedWorkflow<S>>>,
    /// Workflows a live task of this process drives now: the only ones its heartbeat extends.
    running: Mutex<HashMap<String, Driven>>,
    /// The token of the next run (see [`Driven::run`]).
    next_run: AtomicU64,
    waiters: Mutex<HashMap<String, Waiters>>,
    /// Whether this store forwards other processes' notifications (decided once, by `Store::listen`).
    listener: OnceCell<bool>,
}

impl<S: Store> Core<S> {
    /// Extends the leases of the workflows a live task of this process drives (a run that stopped, however,
    /// lets its lease expire, so that any process resumes it); a deadlock or lock timeout is tried again at
    /// once, a few times (the lease would otherwise wait a whole heartbeat period closer to its end).
    async fn heartbeat(&self) -> Result<u64> {
        let ids: Vec<String> = self.running().keys().cloned().collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let mut tries = 0;
        loop {
            let now = self.now();
            match self.store.heartbeat(&self.owner, &ids, now + millis(self.config.lease), now).await {
                Err(Error::Database(e)) if is_transient(&e) && tries < 3 => tries += 1,
                done => return done,
            }
            tokio::time::sleep(Duration::from_millis(TRANSIENT_RETRY_MS * tries)).await;
        }
    }

    pub(crate) fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Driven>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that a new run drives `workflow_id` (replacing an older run's entry); returns the run's token.
    fn drive_here(running: &mut HashMap<String, Driven>, next_run: &AtomicU64, workflow_id: &str, hash: &str) -> u64 {
        let run = next_run.fetch_add(1, Ordering::Relaxed);
        running.insert(workflow_id.to_owned(), Driven { run, input_hash: hash.to_owned() });
        run
    }

    /// Run `run` of `workflow_id` ended: the workflow is no longer driven here, unless a newer run drives it.
    pub(crate) fn forget_running(&self, workflow_id: &str, run: u64) {
        let mut running = self.running();
        if running.get(workflow_id).is_some_and(|d| d.run == run) {
            running.remove(workflow_id);
        }
    }

    /// Wakes the waiters of `workflow_id` (only them).
    pub(crate) fn announce(&self, workflow_id: &str, outcome: Option<Arc<Outcome>>) {
        let waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = waiters.get(workflow_id) {
            w.tx.send_replace(Some(outcome));
        }
    }

    fn subscribe(self: &Arc<Self>, workflow_id: &str) -> Subscription<S> {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let entry =
            waiters.entry(workflow_id.to_owned()).or_insert_with(|| Waiters { tx: watch::Sender::new(None), count: 0 });
        entry.count += 1;
        Subscription { core: self.clone(), workflow_id: workflow_id.to_owned(), rx: entry.tx.subscribe() }
    }
}

/// One waiter's registration; dropping it forgets the waiter.
struct Subscription<S: Store> {
    core: Arc<Core<S>>,
    workflow_id: String,
    rx: watch::Receiver<Heard>,
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

/// Builds an [`Engine`]: its store, clock, configuration and workflow types.
pub struct EngineBuilder<S: Store> {
    store: S,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
    registry: HashMap<&'static str, Arc<dyn ErasedWorkflow<S>>>,
}

impl<S: Store> EngineBuilder<S> {
    /// Registers a workflow type under [`Workflow::NAME`].
    pub fn register<W: Workflow<S>>(mut self, workflow: W) -> Self {
        self.registry.insert(W::NAME, Arc::new(workflow));
        self
    }

    /// Replaces the system clock (tests of leases and waits).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Replaces the default configuration.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// The engine. Nothing runs in the background until [`Engine::spawn_background`].
    pub fn build(self) -> Engine<S> {
        Engine {
            core: Arc::new(Core {
                store: self.store,
                config: self.config,
                shutdown: CancellationToken::new(),
                clock: self.clock,
                owner: uuid::Uuid::new_v4().to_string(),
                registry: self.registry,
                running: Mutex::new(HashMap::new()),
                next_run: AtomicU64::new(1),
                waiters: Mutex::new(HashMap::new()),
                listener: OnceCell::new(),
            }),
        }
    }
}

/// A durable-step engine over one store. Cheap to clone.
pub struct Engine<S: Store> {
    core: Arc<Core<S>>,
}

impl<S: Store> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self { core: self.core.clone() }
    }
}

/// A workflow with its steps and compensations, for operators.
#[derive(Debug, Clone, Serialize)]
pub struct WorkflowView {
    /// The workflow.
    pub workflow: WorkflowRecord,
    /// Its steps, in the order they started.
    pub steps: Vec<StepRecord>,
    /// Its registered compensations.
    pub compensations: Vec<CompensationRecord>,
}

/// A started (or attached) workflow.
pub struct Handle<S: Store> {
    engine: Engine<S>,
    workflow_id: String,
    attached: bool,
    /// For a run this start spawned: its waiters' registration, made before the run could end, so that
    /// [`Handle::wait`] hears its outcome even when it ended first (no read of the workflow).
    early: std::sync::Mutex<Option<Subscription<S>>>,
}

impl<S: Store> Handle<S> {
    /// The workflow's id.
    pub fn workflow_id(&self) -> &str {
        &self.workflow_id
    }

    /// Whether this start found the workflow already recorded with the same input, and attached to it.
    pub fn attached(&self) -> bool {
        self.attached
    }

    /// Waits up to `timeout` for the workflow to end; `None` if it is still running then.
    pub async fn wait(&self, timeout: Duration) -> Result<Option<Outcome>> {
        let early = self.early.lock().map(|mut early| early.take()).unwrap_or(None);
        let subscription = early.unwrap_or_else(|| self.engine.core.subscribe(&self.workflow_id));
        self.engine.wait_on(&self.workflow_id, timeout, subscription).await
    }
}

impl<S: Store> Engine<S> {
    /// An engine builder over `store`.
    pub fn builder(store: S) -> EngineBuilder<S> {
        EngineBuilder { store, clock: Arc::new(SystemClock), config: EngineConfig::default(), registry: HashMap::new() }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.core.store
    }

    /// This engine's lease owner id (unique per process and engine).
    pub fn owner(&self) -> &str {
        &self.core.owner
    }

    /// Starts workflow `W` under `workflow_id` and runs it in this process. Returns once the workflow is
    /// durably recorded (its first commit). A start of an id already recorded with the same input attaches to
    /// it; with another input it is [`Error::Conflict`]. Two starts racing for one id both run the first
    /// phase's transactional steps; the one whose first commit finds the row already there rolls its phase
    /// back and attaches (so those steps must only touch the database, as every transactional step must).
    pub async fn start<W: Workflow<S>>(&self, workflow_id: &str, input: &W::Input) -> Result<Handle<S>> {
        let input = serde_json::to_string(input)?;
        let hash = input_hash(&input);
        let wf = self.core.registry.get(W::NAME).cloned().ok_or(Error::UnknownWorkflowType(W::NAME.to_owned()))?;
        if self.core.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        let run = {
            let mut running = self.core.running();
            if let Some(driven) = running.get(workflow_id) {
                return self.attach_if_same(workflow_id, driven.input_hash == hash);
            }
            Core::<S>::drive_here(&mut running, &self.core.next_run, workflow_id, &hash)
        };
        let now = self.core.now();
        let record = WorkflowRecord {
            workflow_id: workflow_id.to_owned(),
            name: W::NAME.to_owned(),
            input,
            input_hash: hash.clone(),
            state: state::RUNNING.to_owned(),
            output: None,
            error: None,
            lease_owner: Some(self.core.owner.clone()),
            lease_expires_at: Some(now + millis(self.core.config.lease)),
            lease_epoch: 1,
            next_attempt_at: now,
            notify: false,
            created_at: now,
            updated_at: now,
        };
        let (tx, rx) = oneshot::channel();
        let early = self.core.subscribe(workflow_id);
        tokio::spawn(drive(self.core.clone(), wf, record, run, true, Some(tx)));
        match rx.await {
            Ok(Ok(true)) => Ok(self.handle(workflow_id, false, Some(early))),
            Ok(Err(e)) => Err(e),
            Ok(Ok(false)) | Err(_) => match self.core.store.workflow(workflow_id).await? {
                Some(existing) => self.attach_if_same(workflow_id, existing.input_hash == hash),
                None => Err(Error::ShuttingDown),
            },
        }
    }

    fn attach_if_same(&self, workflow_id: &str, same: bool) -> Result<Handle<S>> {
        if same {
            Ok(self.handle(workflow_id, true, None))
        } else {
            Err(Error::Conflict { workflow_id: workflow_id.to_owned() })
        }
    }

    fn handle(&self, workflow_id: &str, attached: bool, early: Option<Subscription<S>>) -> Handle<S> {
        Handle {
            engine: self.clone(),
            workflow_id: workflow_id.to_owned(),
            attached,
            early: std::sync::Mutex::new(early),
        }
    }

    /// Waits up to `timeout` for workflow `workflow_id` to end, whichever process runs it: by in-process
    /// notification, Postgres `NOTIFY` from other processes, and polling as the source of truth.
    pub async fn wait(&self, workflow_id: &str, timeout: Duration) -> Result<Option<Outcome>> {
        self.wait_on(workflow_id, timeout, self.core.subscribe(workflow_id)).await
    }

    /// [`Engine::wait`] with `subscription`, which may have heard the outcome already.
    async fn wait_on(
        &self,
        workflow_id: &str,
        timeout: Duration,
        mut subscription: Subscription<S>,
    ) -> Result<Option<Outcome>> {
        let deadline = Instant::now() + timeout;
        let mut asked_remote = false;
        loop {
            // Announced since the subscription (by a run of this process): no need to read it.
            if subscription.rx.has_changed().unwrap_or(false)
                && let Some(Some(outcome)) = subscription.rx.borrow_and_update().clone()
            {
                return Ok(Some((*outcome).clone()));
            }
            let here = self.core.running().contains_key(workflow_id);
            if !here {
                let mut record = self.core.store.workflow(workflow_id).await?;
                // Ask the runner elsewhere for a notification only for a workflow still running: a finished one
                // (every repeat of a finished payment) is answered by the read, without a write.
                if !asked_remote && record.as_ref().is_some_and(|r| !state::is_final(&r.state)) {
                    asked_remote = self.listen_remote().await;
                    if asked_remote {
                        record = self.core.store.request_notify(workflow_id).await?;
                    }
                }
                let record = record.ok_or_else(|| Error::NotFound(workflow_id.to_owned()))?;
                if let Some(outcome) = Outcome::from_record(&record) {
                    return Ok(Some(outcome));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let slice = (deadline - now).min(self.core.config.poll_interval);
            let heard = tokio::time::timeout(slice, subscription.rx.changed()).await;
            if let Ok(Ok(())) = heard
                && let Some(Some(outcome)) = subscription.rx.borrow_and_update().clone()
            {
                return Ok(Some((*outcome).clone()));
            }
        }
    }

    /// Starts, once, the task that forwards other processes' notifications; whether this backend has them.
    async fn listen_remote(&self) -> bool {
        let core = self.core.clone();
        *self
            .core
            .listener
            .get_or_init(|| async move {
                // Listen before the first wait goes on, so that no notification falls between the two.
                let first = match core.store.listen().await {
                    Ok(None) => return false,
                    first => first,
                };
                let mut connected = Some(first);
                tokio::spawn(async move {
                    loop {
                        let listening = match connected.take() {
                            Some(first) => first,
                            None => core.store.listen().await,
                        };
                        match listening {
                            Ok(Some(mut listener)) => loop {
                                tokio::select! {
                                    () = core.shutdown.cancelled() => return,
                                    got = listener.recv() => match got {
                                        Ok(id) => core.announce(&id, None),
                                        Err(e) => {
                                            tracing::warn!(error = %e, "notification listener failed; reconnecting");
                                            break;
                                        }
                                    },
                                }
                            },
                            Ok(None) => return,
                            Err(e) => tracing::warn!(error = %e, "could not listen for notifications"),
                        }
                        tokio::select! {
                            () = core.shutdown.cancelled() => return,
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                });
                true
            })
            .await
    }

    /// Claims due workflows (up to the free share of `max_concurrent`) and runs them. Returns how many.
    pub async fn recover_once(&self) -> Result<usize> {
        if self.core.shutdown.is_cancelled() {
            return Ok(0);
        }
        let free = self.core.config.max_concurrent.saturating_sub(self.core.running().len());
        if free == 0 {
            return Ok(0);
        }
        let now = self.core.now();
        let lease_until = now + millis(self.core.config.lease);
        let claimed = self
            .core
            .store
            .claim_due(&self.core.owner, now, lease_until, i64::try_from(free).unwrap_or(i64::MAX))
            .await?;
        let count = claimed.len();
        for record in claimed {
            let Some(wf) = self.core.registry.get(record.name.as_str()).cloned() else {
                tracing::warn!(workflow_id = %record.workflow_id, name = %record.name,
                    "no workflow type of this name is registered here; leaving it to another process");
                self.core.store.release(&record.workflow_id, record.lease_epoch, lease_until, now).await?;
                continue;
            };
            tracing::info!(workflow_id = %record.workflow_id, state = %record.state, "resuming workflow");
            let run = Core::<S>::drive_here(
                &mut self.core.running(),
                &self.core.next_run,
                &record.workflow_id,
                &record.input_hash,
            );
            tokio::spawn(drive(self.core.clone(), wf, record, run, false, None));
        }
        Ok(count)
    }

    /// Spawns the recovery loop and the lease heartbeat; both stop at [`Engine::shutdown`].
    pub fn spawn_background(&self) -> JoinHandle<()> {
        let engine = self.clone();
        tokio::spawn(async move {
            let core = &engine.core;
            let mut heartbeat = tokio::time::interval(core.config.lease / 3);
            let mut poll = tokio::time::interval(core.config.poll_interval);
            heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = core.shutdown.cancelled() => return,
                    _ = heartbeat.tick() => {
                        if let Err(e) = core.heartbeat().await {
                            tracing::warn!(error = %e, "lease heartbeat failed");
                        }
                    }
                    _ = poll.tick() => {
                        if let Err(e) = engine.recover_once().await {
                            tracing::warn!(error = %e, "recovery scan failed");
                        }
                    }
                }
            }
        })
    }

    /// Stops taking work, lets running workflows reach their next step boundary (up to `grace`), then
    /// releases every lease this engine still holds so another process can resume at once.
    pub async fn shutdown(&self, grace: Duration) -> Result<()> {
        self.core.shutdown.cancel();
        let deadline = Instant::now() + grace;
        while !self.core.running().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.core.store.release_all(&self.core.owner, self.core.now()).await?;
        Ok(())
    }

    /// A workflow with its steps and compensations.
    pub async fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowView>> {
        let Some(workflow) = self.core.store.workflow(workflow_id).await? else {
            return Ok(None);
        };
        let (steps, compensations) =
            tokio::try_join!(self.core.store.steps(workflow_id), self.core.store.compensations(workflow_id))?;
        Ok(Some(WorkflowView { workflow, steps, compensations }))
    }

    /// A page of workflows, newest first, optionally in one state, created before `before` (ms).
    pub async fn list(&self, state: Option<&str>, before: Option<i64>, limit: i64) -> Result<Vec<WorkflowRecord>> {
        self.core.store.list(state, before, limit.clamp(1, 1000)).await
    }

    /// Retries a workflow that ended badly: `compensation_failed` runs its compensations again; `failed`
    /// with no compensation done (e.g. a step mismatch) runs forward again from the failed step.
    pub async fn retry(&self, workflow_id: &str) -> Result<WorkflowRecord> {
        let view = self.workflow(workflow_id).await?.ok_or_else(|| Error::NotFound(workflow_id.to_owned()))?;
        let now = self.core.now();
        let (from, how): (&[&str], Reopen) = match view.workflow.state.as_str() {
            state::COMPENSATION_FAILED => (&[state::COMPENSATION_FAILED], Reopen::Compensation),
            state::FAILED if view.compensations.iter().all(|c| c.status != "done") => {
                (&[state::FAILED], Reopen::Forward)
            }
            other => {
                return Err(Error::InvalidState {
                    workflow_id: workflow_id.to_owned(),
                    state: other.to_owned(),
                    reason: "only compensation_failed workflows, or failed ones with nothing compensated, can be retried",
                });
            }
        };
        self.core.store.reopen(workflow_id, from, how, None, now).await?.ok_or_else(|| Error::InvalidState {
            workflow_id: workflow_id.to_owned(),
            state: "changed".to_owned(),
            reason: "the workflow changed state meanwhile",
        })
    }

    /// Cancels a running workflow: any current run is fenced out, the registered compensations run, and the
    /// workflow ends `cancelled`.
    pub async fn cancel(&self, workflow_id: &str) -> Result<WorkflowRecord> {
        let failure = Failure::new(CANCELLED_CODE, "cancelled by an operator");
        let now = self.core.now();
        let reopened = self
            .core
            .store
            .reopen(workflow_id, &[state::RUNNING], Reopen::Cancel, Some(failure_json(&failure)), now)
            .await?;
        match reopened {
            Some(record) => Ok(record),
            None => {
                let state = self.core.store.workflow(workflow_id).await?.map(|w| w.state).unwrap_or_default();
                Err(Error::InvalidState {
                    workflow_id: workflow_id.to_owned(),
                    state,
                    reason: "only running workflows can be cancelled",
                })
            }
        }
    }
}

/// SHA-256 of a workflow's input JSON, hex.
pub(crate) fn input_hash(input: &str) -> String {
    let digest = Sha256::digest(input.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)
}
