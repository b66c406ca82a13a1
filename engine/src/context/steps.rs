//! The step API: transactional and external steps, the retry wait between attempts, and the replay that
//! returns a finished step's stored outcome instead of running it.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Failure, Interrupt, StepError, failure_json, is_transient, parse_failure};
use crate::step::{Attempt, BoxFuture, Previous, StepSpec};
use crate::store::{Conn, StepKind, StepRecord, StepStatus, Store, WorkflowUpdate};

use super::WorkflowContext;

impl<S: Store> WorkflowContext<S> {
    /// Runs a transactional step: `f` gets the workflow's open transaction, and its writes commit together
    /// with the step's row, exactly once. A finished step returns its stored output without running.
    ///
    /// `Err(StepError::Terminal)` fails the workflow; retryable and database errors replay the body from the
    /// last commit after the step's retry wait, until its attempts are used up.
    pub async fn transactional<T, F>(&mut self, spec: impl Into<StepSpec>, f: F) -> Result<T, Interrupt>
    where
        T: Serialize + DeserializeOwned + Send,
        F: for<'c> FnOnce(&'c mut Conn<S>) -> BoxFuture<'c, Result<T, StepError>> + Send,
    {
        let spec = spec.into();
        let key = format!("{}{}", self.replay.prefix, spec.key);
        if let Some(done) = self.replay(&key, &spec.name, StepKind::Transactional)? {
            return done;
        }
        self.check_shutdown()?;
        let now = self.core.now();
        let span =
            tracing::info_span!("step", workflow_id = %self.run.workflow_id, step_key = %key, kind = "transactional");
        let tx = self.open_tx().await?;
        let result = tracing::Instrument::instrument(f(&mut **tx), span).await;
        let attempts = self.run.tx_attempts.get(&key).copied().unwrap_or(0) + 1;
        let row = |status: StepStatus, output: Option<String>, error: Option<String>| StepRecord {
            workflow_id: String::new(),
            step_key: key.clone(),
            step_name: spec.name.clone(),
            kind: StepKind::Transactional,
            status,
            attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
            output,
            error,
            started_at: now,
            finished_at: Some(now),
            seq: None,
        };
        match result {
            Ok(value) => {
                let output = serde_json::to_string(&value).map_err(|e| Interrupt::Engine(e.into()))?;
                // Registered once the step has decided, in its phase: rolled back with it.
                if let Some((name, input)) = &spec.compensation {
                    self.register_compensation(&key, name, input)?;
                }
                self.push_step(row(StepStatus::Completed, Some(output), None));
                Ok(value)
            }
            Err(StepError::Terminal(failure)) => {
                self.abort_phase().await;
                self.push_step(row(StepStatus::Failed, None, Some(failure_json(&failure))));
                Err(Interrupt::Failed(failure))
            }
            Err(StepError::Database(e)) if is_transient(&e) => {
                // A deadlock or lock timeout undid the whole phase: not another attempt of this step. The run
                // replays it like a commit that met one (see `run::drive`).
                self.abort_phase().await;
                Err(Interrupt::Engine(e.into()))
            }
            Err(
                e @ (StepError::Retryable(_)
                | StepError::UnknownOutcome(_)
                | StepError::Pending(_)
                | StepError::Database(_)),
            ) => {
                self.abort_phase().await;
                self.run.tx_attempts.insert(key.clone(), attempts);
                match spec.retry.delay_after(attempts) {
                    Some(delay) => Err(Interrupt::Retry { delay_ms: millis(delay) }),
                    None => {
                        let failure = Failure::new("retries_exhausted", format!("step {key}: {e}"));
                        self.push_step(row(StepStatus::Failed, None, Some(failure_json(&failure))));
                        Err(Interrupt::Failed(failure))
                    }
                }
            }
        }
    }

    /// Runs an external step (a call outside the database). Its intent commits before each attempt and its
    /// outcome commits with the next commit; an attempt after a crash or an unknown outcome is told so through
    /// [`Attempt::previous`] and must find out what happened before acting again.
    ///
    /// Retryable errors wait by the step's policy (in-process when short, persisted when long) until its
    /// attempts are used up; unknown outcomes are retried at most every `max_interval`, never given up; pending
    /// ones likewise, on the step's pending schedule.
    pub async fn external<T, F, Fut>(&mut self, spec: impl Into<StepSpec>, mut f: F) -> Result<T, Interrupt>
    where
        T: Serialize + DeserializeOwned + Send,
        F: FnMut(Attempt) -> Fut + Send,
        Fut: Future<Output = Result<T, StepError>> + Send,
    {
        let spec = spec.into();
        let key = format!("{}{}", self.replay.prefix, spec.key);
        if let Some(done) = self.replay(&key, &spec.name, StepKind::External)? {
            return done;
        }
        // A statement phase just committed this step's first intent: attempt 1 starts from it.
        let mut intent_committed = self.replay.fresh_intents.remove(&key);
        let (mut attempts, mut previous, started_at) = match self.replay.history.get(&key) {
            Some(s) if intent_committed => (0, Previous::None, s.started_at),
            Some(s) => (
                u32::try_from(s.attempts).unwrap_or(0),
                match s.status {
                    StepStatus::Retrying => Previous::Failed(s.error.clone().unwrap_or_default()),
                    _ => Previous::Unknown,
                },
                s.started_at,
            ),
            None => (0, Previous::None, self.core.now()),
        };
        // What the last attempt learnt, kept on the row of the next one while it is in flight: what the step
        // waits for stays said (a `processing` charge), not just "a call in flight".
        let mut learnt = self.replay.history.get(&key).and_then(|s| s.error.clone());
        if let Some((name, input)) = &spec.compensation {
            self.register_compensation(&key, name, input)?;
        }
        let row =
            |status, attempts: u32, output: Option<String>, error: Option<String>, done: Option<i64>| StepRecord {
                workflow_id: String::new(),
                step_key: key.clone(),
                step_name: spec.name.clone(),
                kind: StepKind::External,
                status,
                attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
                output,
                error,
                started_at,
                finished_at: done,
                seq: None,
            };
        loop {
            self.check_shutdown()?;
            attempts += 1;
            if !std::mem::take(&mut intent_committed) {
                self.push_step(row(StepStatus::Started, attempts, None, learnt.clone(), None));
                self.commit(WorkflowUpdate::default()).await?;
            }
            // The call outside runs in the step's span: a client that carries the trace onward (the channel's)
            // names this step as the caller.
            let span = tracing::info_span!("step", workflow_id = %self.run.workflow_id, step_key = %key, kind = "external", attempt = attempts);
            let result =
                tracing::Instrument::instrument(f(Attempt { number: attempts, previous: previous.clone() }), span)
                    .await;
            let now = self.core.now();
            let (status, message, delay) = match result {
                Ok(value) => {
                    let output = serde_json::to_string(&value).map_err(|e| Interrupt::Engine(e.into()))?;
                    self.push_step(row(StepStatus::Completed, attempts, Some(output), None, Some(now)));
                    return Ok(value);
                }
                Err(StepError::Terminal(failure)) => {
                    self.push_step(row(StepStatus::Failed, attempts, None, Some(failure_json(&failure)), Some(now)));
                    return Err(Interrupt::Failed(failure));
                }
                Err(StepError::UnknownOutcome(m)) => (StepStatus::Unknown, m, spec.retry.delay_unbounded(attempts)),
                Err(StepError::Pending(m)) => {
                    (StepStatus::Unknown, m, spec.pending.unwrap_or(spec.retry).delay_unbounded(attempts))
                }
                Err(e @ (StepError::Retryable(_) | StepError::Database(_))) => match spec.retry.delay_after(attempts) {
                    Some(delay) => (StepStatus::Retrying, e.to_string(), delay),
                    None => {
                        let failure = Failure::new("retries_exhausted", format!("step {key}: {e}"));
                        let error = Some(failure_json(&failure));
                        self.push_step(row(StepStatus::Failed, attempts, None, error, Some(now)));
                        return Err(Interrupt::Failed(failure));
                    }
                },
            };
            tracing::debug!(workflow_id = %self.run.workflow_id, step_key = %key, attempts, %message, "step will retry");
            previous =
                if status == StepStatus::Unknown { Previous::Unknown } else { Previous::Failed(message.clone()) };
            learnt = Some(message.clone());
            self.push_step(row(status, attempts, None, Some(message), None));
            self.wait(delay).await?;
        }
    }

    /// Waits `delay` before the next attempt: asleep in-process when short, otherwise (or when the engine
    /// shuts down meanwhile) persisted as the workflow's `next_attempt_at` with the lease released.
    pub(super) async fn wait(&mut self, delay: Duration) -> Result<(), Interrupt> {
        if delay <= self.core.config.max_inline_wait {
            // An operator's wake (`Engine::wake`) ends the wait: the next attempt is made now.
            let woken = self.core.woken(&self.run.workflow_id);
            tokio::select! {
                () = tokio::time::sleep(delay) => return Ok(()),
                () = crate::core::woken(woken) => return Ok(()),
                () = self.core.shutdown.cancelled() => {}
            }
        }
        let until_ms = self.core.now() + i64::try_from(millis(delay)).unwrap_or(i64::MAX / 2);
        self.commit(WorkflowUpdate { release_until: Some(until_ms), ..WorkflowUpdate::default() }).await?;
        Err(Interrupt::Suspended { until_ms })
    }

    /// Looks a step up in the history: its stored outcome when it finished, `None` when it must run.
    #[allow(clippy::type_complexity)]
    pub(super) fn replay<T: DeserializeOwned>(
        &self,
        key: &str,
        name: &str,
        kind: StepKind,
    ) -> Result<Option<Result<T, Interrupt>>, Interrupt> {
        let Some(s) = self.replay.history.get(key) else {
            return Ok(None);
        };
        if s.step_name != name || s.kind != kind {
            return Err(Interrupt::StepMismatch {
                step_key: key.to_owned(),
                stored: format!("{} ({})", s.step_name, s.kind),
                now: format!("{name} ({kind})"),
            });
        }
        match s.status {
            StepStatus::Completed => {
                let output = s.output.as_deref().unwrap_or("null");
                Ok(Some(serde_json::from_str(output).map_err(|e| Interrupt::Engine(e.into()))))
            }
            StepStatus::Failed => Ok(Some(Err(Interrupt::Failed(parse_failure(s.error.as_deref()))))),
            StepStatus::Started | StepStatus::Unknown | StepStatus::Retrying => Ok(None),
        }
    }
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
