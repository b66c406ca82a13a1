//! The context a workflow body runs its steps through, by idea: the step API and replay of finished steps
//! (`steps.rs`), statement phases (`phase.rs`), the fenced commit (`commit.rs`); here, the run's state and the
//! bookkeeping they share (step rows, compensations).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::core::{Core, StartSignal};
use crate::error::{Failure, Interrupt};
use crate::phase::StatementPhase;
use crate::store::{CompensationRecord, CompensationStatus, StepRecord, StepStatus, Store, Tx, WorkflowRecord};

mod commit;
mod phase;
mod steps;

/// What a workflow body runs its steps through.
///
/// Consecutive transactional steps share one transaction (an *atomic phase*) that commits, with every step's
/// row and the workflow's progress, at the next external step, wait or end of the workflow. A transactional
/// step that fails rolls back its whole phase.
pub struct WorkflowContext<S: Store> {
    core: Arc<Core<S>>,
    /// What this run is, and what it keeps across replays of the body.
    run: Run,
    /// What the current replay of the body has seen and holds open.
    replay: Replay<S>,
}

/// The part of a run that survives a replay of the body (after a transient failure or a short wait).
struct Run {
    workflow_id: String,
    input: String,
    /// The lease epoch this run holds, which every commit's fence checks.
    epoch: i64,
    /// The workflow row, while it is not yet in the database: it is inserted by the first commit, whose
    /// transaction rolls back (and the run stops as a duplicate) if another start inserted it first.
    insert: Option<WorkflowRecord>,
    /// Rows not committed yet: external steps' outcomes (kept across replays; they happened) and the open
    /// phase's transactional steps (forgotten when it aborts).
    pending_steps: Vec<StepRecord>,
    /// Attempts of transactional steps whose phase was rolled back, by step key.
    tx_attempts: HashMap<String, u32>,
    /// The start waiting to hear of the first commit.
    first_commit: Option<StartSignal>,
}

/// The part of a run that one replay of the body builds from the stored history.
struct Replay<S: Store> {
    /// Committed steps, and the uncommitted ones of the open phase.
    history: HashMap<String, StepRecord>,
    /// The open phase's transaction.
    tx: Option<Tx<S>>,
    /// The workflow's compensations as this run sees them: the committed ones, and those registered (or whose
    /// status changed) since. Each commit that changes them writes the whole list (the lease makes this run
    /// its only writer).
    comps: Vec<CompensationRecord>,
    /// The compensations as last committed, which an aborted phase returns to.
    committed_comps: Vec<CompensationRecord>,
    /// The key prefix of the compensation running now (empty in the forward body).
    prefix: String,
    /// A statement phase left for the workflow's completing commit ([`WorkflowContext::finish_with`]).
    deferred: Option<StatementPhase>,
    /// External steps whose first attempt's intent a statement phase of this run committed.
    fresh_intents: HashSet<String>,
    /// The `seq` of the next step that runs for the first time (see [`StepRecord::seq`]).
    next_seq: i32,
}

impl<S: Store> Replay<S> {
    fn new(steps: Vec<StepRecord>, comps: Vec<CompensationRecord>) -> Self {
        // Past every step recorded: rows written before `seq` existed count too, so a new step never shares one.
        let recorded = i32::try_from(steps.len()).unwrap_or(i32::MAX);
        let next_seq = steps.iter().filter_map(|s| s.seq).map(|s| s.saturating_add(1)).fold(recorded, i32::max);
        Self {
            history: steps.into_iter().map(|s| (s.step_key.clone(), s)).collect(),
            tx: None,
            committed_comps: comps.clone(),
            comps,
            prefix: String::new(),
            deferred: None,
            fresh_intents: HashSet::new(),
            next_seq,
        }
    }

    /// The `seq` of step `key`: its recorded one, else the next (a step that runs for the first time).
    fn seq_of(&mut self, key: &str) -> i32 {
        if let Some(seq) = self.history.get(key).and_then(|s| s.seq) {
            return seq;
        }
        let seq = self.next_seq;
        self.next_seq = seq.saturating_add(1);
        seq
    }
}

impl<S: Store> WorkflowContext<S> {
    /// A run of `record`; `insert`: its row is not in the database yet (a fresh start, which `first_commit`
    /// hears of). Call [`WorkflowContext::replay_from`] before each run of the body.
    pub(crate) fn new(
        core: Arc<Core<S>>,
        record: &WorkflowRecord,
        insert: bool,
        first_commit: Option<StartSignal>,
    ) -> Self {
        let run = Run {
            workflow_id: record.workflow_id.clone(),
            input: record.input.clone(),
            epoch: record.lease_epoch,
            insert: insert.then(|| record.clone()),
            pending_steps: Vec::new(),
            tx_attempts: HashMap::new(),
            first_commit,
        };
        Self { core, run, replay: Replay::new(Vec::new(), Vec::new()) }
    }

    /// Starts a replay of the body from the stored `steps` and `comps` (none before the first commit), with
    /// this run's uncommitted outcomes on top. An open transaction is rolled back.
    pub(crate) fn replay_from(&mut self, steps: Vec<StepRecord>, comps: Vec<CompensationRecord>) {
        self.replay = Replay::new(steps, comps);
        for s in &self.run.pending_steps {
            if let Some(seq) = s.seq {
                self.replay.next_seq = self.replay.next_seq.max(seq.saturating_add(1));
            }
            self.replay.history.insert(s.step_key.clone(), s.clone());
        }
    }

    /// The workflow's input, decoded (compensations read it here rather than storing copies of it).
    pub fn input<T: DeserializeOwned>(&self) -> Result<T, Interrupt> {
        serde_json::from_str(&self.run.input)
            .map_err(|e| Interrupt::Failed(Failure::new("invalid_input", format!("stored input does not decode: {e}"))))
    }

    /// The id of the running workflow.
    pub fn workflow_id(&self) -> &str {
        &self.run.workflow_id
    }

    /// Whether the workflow is in the database (its first commit happened).
    pub(crate) fn recorded(&self) -> bool {
        self.run.insert.is_none()
    }

    /// The row of step `key` (without the compensation prefix), committed or in the open phase.
    pub(crate) fn step(&self, key: &str) -> Option<&StepRecord> {
        self.replay.history.get(key)
    }

    /// The store, for what an attempt reads outside the workflow's own phases (evidence delivered from outside,
    /// say): its writes are not the workflow's and are not rolled back with it.
    pub fn store(&self) -> &S {
        &self.core.store
    }

    /// What step `key` of the compensation of the forward step `forward` returned, once it completed: a later
    /// compensation learns what an earlier one did (they run in the reverse order of their forward steps), say
    /// whether the refund of a charge gave the money back, to record the workflow's end accordingly. `None`
    /// when that compensation is not registered, its step has not run or not completed, or its output is not a
    /// `T`.
    pub fn compensation_output<T: DeserializeOwned>(&self, forward: &str, key: &str) -> Option<T> {
        let comp = self.replay.comps.iter().find(|c| c.step_key == forward)?;
        let step = self.replay.history.get(&format!("{}{}/{key}", crate::run::COMPENSATION_PREFIX, comp.seq))?;
        if step.status != StepStatus::Completed {
            return None;
        }
        serde_json::from_str(step.output.as_deref()?).ok()
    }

    /// Now, by the engine's clock (milliseconds since the epoch).
    pub fn now_ms(&self) -> i64 {
        self.core.now()
    }

    fn check_shutdown(&self) -> Result<(), Interrupt> {
        if self.core.shutdown.is_cancelled() { Err(Interrupt::Shutdown) } else { Ok(()) }
    }

    fn register_compensation(&mut self, key: &str, name: &str, input: &serde_json::Value) -> Result<(), Interrupt> {
        if self.replay.comps.iter().any(|c| c.step_key == key) {
            return Ok(());
        }
        let seq = self.replay.comps.iter().map(|c| c.seq + 1).max().unwrap_or(0);
        self.replay.comps.push(CompensationRecord {
            workflow_id: self.run.workflow_id.clone(),
            seq,
            step_key: key.to_owned(),
            name: name.to_owned(),
            input: serde_json::to_string(input).map_err(|e| Interrupt::Engine(e.into()))?,
            status: CompensationStatus::Registered,
        });
        Ok(())
    }

    fn push_step(&mut self, mut row: StepRecord) {
        row.workflow_id.clone_from(&self.run.workflow_id);
        row.seq = Some(self.replay.seq_of(&row.step_key));
        self.replay.history.insert(row.step_key.clone(), row.clone());
        match self.run.pending_steps.iter_mut().find(|s| s.step_key == row.step_key) {
            Some(slot) => *slot = row,
            None => self.run.pending_steps.push(row),
        }
    }

    pub(crate) fn push_compensation_status(&mut self, mut comp: CompensationRecord, status: CompensationStatus) {
        comp.status = status;
        match self.replay.comps.iter_mut().find(|c| c.seq == comp.seq) {
            Some(slot) => *slot = comp,
            None => self.replay.comps.push(comp),
        }
    }

    pub(crate) fn set_prefix(&mut self, prefix: String) {
        self.replay.prefix = prefix;
    }

    /// The `seq` of step `key` (see [`Replay::seq_of`]).
    pub(crate) fn seq_of(&mut self, key: &str) -> i32 {
        self.replay.seq_of(key)
    }

    pub(crate) fn core(&self) -> &Core<S> {
        &self.core
    }

    /// The start still waiting for the first commit, if any.
    pub(crate) fn take_started(&mut self) -> Option<StartSignal> {
        self.run.first_commit.take()
    }
}
