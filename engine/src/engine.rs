//! The engine's front: building it with its workflow types, starting (or attaching to) a workflow, and
//! waiting for its outcome, whichever process runs it. The background work is in `background.rs`, operator
//! actions in `ops.rs`, one run in `run.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::clock::{Clock, SystemClock};
use crate::config::EngineConfig;
use crate::core::{Core, Heard, Subscription, millis};
use crate::error::{Error, Result};
use crate::outcome::Outcome;
use crate::run::drive;
use crate::store::{Store, WorkflowRecord, WorkflowState};
use crate::workflow::{ErasedWorkflow, Workflow};

/// How often a start met by an unrecorded run of another input under its id looks again (besides hearing that
/// run's end): its first commit records the id, and is announced to nobody.
const UNRECORDED_POLL: Duration = Duration::from_millis(20);

/// The workflow types an engine runs, by name.
pub(crate) type Registry<S> = HashMap<&'static str, Arc<dyn ErasedWorkflow<S>>>;

/// Builds an [`Engine`]: its store, clock, configuration and workflow types.
pub struct EngineBuilder<S: Store> {
    store: S,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
    registry: Registry<S>,
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
        Engine { core: Arc::new(Core::new(self.store, self.config, self.clock)), registry: Arc::new(self.registry) }
    }
}

/// A durable-step engine over one store. Cheap to clone.
pub struct Engine<S: Store> {
    pub(crate) core: Arc<Core<S>>,
    pub(crate) registry: Arc<Registry<S>>,
}

impl<S: Store> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self { core: self.core.clone(), registry: self.registry.clone() }
    }
}

/// A started (or attached) workflow.
pub struct Handle<S: Store> {
    engine: Engine<S>,
    workflow_id: String,
    /// The input hash of this start: the workflow whose outcome [`Handle::wait`] answers must have it.
    input_hash: String,
    attached: bool,
    /// Whether the outcome the last [`Handle::wait`] returned was announced by a run of this process (which
    /// ended after this start) rather than read from the workflow.
    heard_here: AtomicBool,
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

    /// Whether the outcome the last [`Handle::wait`] returned was announced by a run of this process, so that
    /// the workflow ended after this start; `false` when it was read from the workflow, which may have ended
    /// long before.
    pub fn ended_after_start(&self) -> bool {
        self.heard_here.load(Ordering::Relaxed)
    }

    /// Waits up to `timeout` for the workflow to end; `None` if it is still running then. When the workflow
    /// recorded under the id has another input than this start's ([`Error::Conflict`]): a start can attach to a
    /// run of its own input that this process was driving, and that run be refused or lose the id to another
    /// start, and the outcome of that workflow is not this start's.
    pub async fn wait(&self, timeout: Duration) -> Result<Option<Outcome>> {
        let early = self.early.lock().map(|mut early| early.take()).unwrap_or(None);
        let subscription = early.unwrap_or_else(|| self.engine.core.subscribe(&self.workflow_id));
        let ended = self.engine.wait_on(&self.workflow_id, timeout, subscription, Some(&self.input_hash)).await?;
        Ok(ended.map(|(outcome, announced)| {
            self.heard_here.store(announced, Ordering::Relaxed);
            outcome
        }))
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
    /// it; with another input it is [`Error::Conflict`] — decided by what is recorded: a start that meets a run
    /// of another input in this process, not yet recorded, waits for that run to record the id or stop. Two
    /// starts racing for one id both run the first
    /// phase's transactional steps; the one whose first commit finds the row already there rolls its phase
    /// back and attaches (so those steps must only touch the database, as every transactional step must).
    pub async fn start<W: Workflow<S>>(&self, workflow_id: &str, input: &W::Input) -> Result<Handle<S>> {
        let tenant = W::tenant(input);
        let input = serde_json::to_string(input)?;
        let hash = input_hash(&input);
        let wf = self.registry.get(W::NAME).cloned().ok_or(Error::UnknownWorkflowType(W::NAME.to_owned()))?;
        if self.core.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        let run = loop {
            {
                let mut running = self.core.running();
                match running.get(workflow_id) {
                    Some(driven) if driven.input_hash == hash => {
                        return Ok(self.handle(workflow_id, &hash, true, None));
                    }
                    Some(_) => {}
                    None => break Core::<S>::drive_here(&mut running, &self.core.next_run, workflow_id, &hash),
                }
            }
            // A run of this process drives another input under the id. The id is that input's only once recorded:
            // until its first commit the run may yet be refused (an unknown order, a token that is not its
            // tenant's) and record nothing, and then this start is the one to run. A conflict decided now would be
            // an answer made up by a concurrent request — and not the answer once that request is gone.
            if self.core.shutdown.is_cancelled() {
                return Err(Error::ShuttingDown);
            }
            let mut ended = self.core.subscribe(workflow_id);
            if let Some(existing) = self.core.store.workflow(workflow_id).await? {
                return self.attach_if_same(workflow_id, &hash, existing.input_hash == hash);
            }
            let _ = tokio::time::timeout(UNRECORDED_POLL, ended.rx.changed()).await;
        };
        let now = self.core.now();
        let record = WorkflowRecord {
            workflow_id: workflow_id.to_owned(),
            name: W::NAME.to_owned(),
            input,
            input_hash: hash.clone(),
            state: WorkflowState::Running,
            output: None,
            error: None,
            lease_owner: Some(self.core.owner.clone()),
            lease_expires_at: Some(now + millis(self.core.config.lease)),
            lease_epoch: 1,
            next_attempt_at: now,
            notify: false,
            created_at: now,
            updated_at: now,
            tenant,
            trace: crate::trace::current(),
        };
        let (tx, rx) = oneshot::channel();
        let early = self.core.subscribe(workflow_id);
        tokio::spawn(drive(self.core.clone(), wf, record, run, true, Some(tx)));
        match rx.await {
            Ok(Ok(true)) => Ok(self.handle(workflow_id, &hash, false, Some(early))),
            Ok(Err(e)) => Err(e),
            Ok(Ok(false)) | Err(_) => match self.core.store.workflow(workflow_id).await? {
                Some(existing) => self.attach_if_same(workflow_id, &hash, existing.input_hash == hash),
                None => Err(Error::ShuttingDown),
            },
        }
    }

    fn attach_if_same(&self, workflow_id: &str, hash: &str, same: bool) -> Result<Handle<S>> {
        if same {
            Ok(self.handle(workflow_id, hash, true, None))
        } else {
            Err(Error::Conflict { workflow_id: workflow_id.to_owned() })
        }
    }

    fn handle(&self, workflow_id: &str, hash: &str, attached: bool, early: Option<Subscription<S>>) -> Handle<S> {
        Handle {
            engine: self.clone(),
            workflow_id: workflow_id.to_owned(),
            input_hash: hash.to_owned(),
            attached,
            heard_here: AtomicBool::new(false),
            early: std::sync::Mutex::new(early),
        }
    }

    /// Waits up to `timeout` for workflow `workflow_id` to end, whichever process runs it: by in-process
    /// notification, Postgres `NOTIFY` from other processes, and polling as the source of truth.
    pub async fn wait(&self, workflow_id: &str, timeout: Duration) -> Result<Option<Outcome>> {
        let ended = self.wait_on(workflow_id, timeout, self.core.subscribe(workflow_id), None).await?;
        Ok(ended.map(|(outcome, _)| outcome))
    }

    /// [`Engine::wait`] with `subscription`, which may have heard the outcome already, and whether the outcome
    /// was announced by a run of this process (rather than read). With `expect`, only a workflow of that input
    /// hash answers: another one recorded under the id is [`Error::Conflict`].
    async fn wait_on(
        &self,
        workflow_id: &str,
        timeout: Duration,
        mut subscription: Subscription<S>,
        expect: Option<&str>,
    ) -> Result<Option<(Outcome, bool)>> {
        let deadline = Instant::now() + timeout;
        let mut asked_remote = false;
        loop {
            // Announced since the subscription (by a run of this process): no need to read it.
            if subscription.rx.has_changed().unwrap_or(false)
                && let Some(outcome) = heard(&mut subscription.rx, expect)
            {
                return Ok(Some((outcome, true)));
            }
            // A run here of another input (this process claimed the workflow that another start recorded) is
            // not one to wait on: the read says whose the id is.
            let here = self.core.running().get(workflow_id).is_some_and(|d| expect.is_none_or(|h| h == d.input_hash));
            if !here {
                let mut record = self.core.store.workflow(workflow_id).await?;
                let conflict = |record: &Option<WorkflowRecord>| {
                    let other = record.as_ref().is_some_and(|r| expect.is_some_and(|hash| hash != r.input_hash));
                    if other { Err(Error::Conflict { workflow_id: workflow_id.to_owned() }) } else { Ok(()) }
                };
                conflict(&record)?;
                // Ask the runner elsewhere for a notification only for a workflow still running: a finished one
                // (every repeat of a finished payment) is answered by the read, without a write.
                if !asked_remote && record.as_ref().is_some_and(|r| !r.state.is_final()) {
                    asked_remote = self.listen_remote().await;
                    if asked_remote {
                        record = self.core.store.request_notify(workflow_id).await?;
                        conflict(&record)?;
                    }
                }
                let record = record.ok_or_else(|| Error::NotFound(workflow_id.to_owned()))?;
                if let Some(outcome) = Outcome::from_record(&record) {
                    return Ok(Some((outcome, false)));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let slice = (deadline - now).min(self.core.config.poll_interval);
            let changed = tokio::time::timeout(slice, subscription.rx.changed()).await;
            if let Ok(Ok(())) = changed
                && let Some(outcome) = heard(&mut subscription.rx, expect)
            {
                return Ok(Some((outcome, true)));
            }
        }
    }
}

/// The outcome a run of this process announced, unless it stopped without one or drove a workflow of another
/// input hash than `expect` (then the workflow is read).
fn heard(rx: &mut watch::Receiver<Heard>, expect: Option<&str>) -> Option<Outcome> {
    match rx.borrow_and_update().as_ref() {
        Some(Some(ended)) if expect.is_none_or(|hash| hash == ended.input_hash) => Some(ended.outcome.clone()),
        _ => None,
    }
}

/// SHA-256 of a workflow's input JSON, hex.
pub(crate) fn input_hash(input: &str) -> String {
    hex::encode(Sha256::digest(input.as_bytes()))
}
