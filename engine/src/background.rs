//! What an engine does in the background: forwarding other processes' notifications, the recovery loop that
//! claims due workflows, the lease heartbeat, and graceful shutdown.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::core::Core;
use crate::engine::Engine;
use crate::error::Result;
use crate::run::drive;
use crate::store::Store;

impl<S: Store> Engine<S> {
    /// Starts, once, the task that forwards other processes' notifications; whether this backend has them.
    pub(crate) async fn listen_remote(&self) -> bool {
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
        let lease = self.core.lease();
        let claimed =
            self.core.store.claim_due(&self.core.owner, lease, i64::try_from(free).unwrap_or(i64::MAX)).await?;
        let count = claimed.len();
        for record in claimed {
            let Some(wf) = self.registry.get(record.name.as_str()).cloned() else {
                tracing::warn!(workflow_id = %record.workflow_id, name = %record.name,
                    "no workflow type of this name is registered here; leaving it to another process");
                let later = lease.now + lease.length_ms;
                self.core.store.release(&record.workflow_id, record.lease_epoch, later, lease.now).await?;
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
}
