//! `onceflow events list [--tenant T] [--after C]` and `onceflow events redeliver <id> [--endpoint we_…]
//! [--webhook-retry-schedule …]`: the event log and a redelivery from a terminal, with what `GET /v1/events` and
//! `POST /v1/events/{id}/redeliver` give an operator. A redelivery stores its schedule with it, so the command
//! takes the serving processes' event flags; it is recorded in the audit log (`--reason`), as `cli:<user>`'s.

use std::sync::Arc;

use onceflow_engine::EngineConfig;
use onceflow_payments::events::Position;
use onceflow_payments::{MockChannel, PaymentStore, Payments};

use crate::config::{ConfigError, EventsCommand};
use crate::database::{OnPayments, with_payments, with_payments_as_is};

/// Why an `events` command failed.
pub(crate) enum CommandError {
    /// Bad usage (exit 2).
    Config(ConfigError),
    /// Anything else (exit 1).
    Other(anyhow::Error),
}

/// Runs an `events` command. Listing never migrates (an operator's look must not change the schema).
pub(crate) async fn run(cmd: EventsCommand) -> Result<(), CommandError> {
    let channel = Arc::new(MockChannel::reliable());
    let config = EngineConfig::default();
    let done = match &cmd {
        EventsCommand::List { database, after, .. } => {
            if let Some(raw) = after
                && Position::parse(raw).is_none()
            {
                return Err(CommandError::Config(ConfigError(format!("--after {raw}: not a cursor this log gave"))));
            }
            let url = database.database_url.clone();
            with_payments_as_is(&url, channel, config, 2, Events(cmd)).await
        }
        EventsCommand::Redeliver { database, .. } => {
            let url = database.database_url.clone();
            with_payments(&url, channel, config, 2, Events(cmd)).await
        }
    };
    done.map_err(CommandError::Config)?.map_err(CommandError::Other)
}

/// The HTTP status the API answers `e` with, for the audit entry of a refused redelivery.
fn status_of(e: &onceflow_payments::events::EventError) -> u16 {
    use onceflow_payments::events::EventError;
    match e {
        EventError::EventNotFound(_) | EventError::EndpointNotFound(_) => 404,
        EventError::EndpointDisabled(_) => 409,
        _ => 500,
    }
}

/// An `events` command, on the service once it is connected.
struct Events(EventsCommand);

impl OnPayments for Events {
    type Output = anyhow::Result<()>;

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
        let payments = match &self.0 {
            EventsCommand::Redeliver { events, .. } => payments.with_events(events.settings()),
            EventsCommand::List { .. } => payments,
        };
        let events = payments.events();
        match self.0 {
            EventsCommand::List { tenant, after, limit, .. } => {
                let after = after.as_deref().and_then(Position::parse);
                let page = events.log(tenant.as_deref(), after, &[], limit).await?;
                println!("{:<32} {:<18} {:<16} {:<24}  CURSOR", "EVENT", "TYPE", "TENANT", "CREATED");
                for e in &page.events {
                    let created = onceflow_payments::events::rfc3339(e.created_at);
                    println!("{:<32} {:<18} {:<16} {:<24}  {}", e.id, e.kind, e.tenant, created, e.position().cursor());
                }
                println!("({} shown) next: {}", page.events.len(), page.next.cursor());
            }
            EventsCommand::Redeliver { event_id, endpoint, reason, .. } => {
                // On the record as over HTTP (`routes/audit.rs`): begun before, completed with the answer after;
                // an event that does not exist is neither redelivered nor recorded.
                let (event, _) = events.event(None, &event_id).await?;
                let engine = payments.engine();
                let entry = onceflow_engine::AuditAction {
                    actor: crate::operate::cli_actor(std::env::var("USER").ok()),
                    action: "redeliver".to_owned(),
                    workflow_id: event.data().get("workflow_id").and_then(|w| w.as_str()).map(str::to_owned),
                    subject: Some(event.id.clone()),
                    tenant: Some(event.tenant.clone()),
                    reason,
                };
                let audit_id = engine.audit_begin(entry).await?;
                let made = events.redeliver(None, &event_id, endpoint.as_deref()).await;
                let (status, result) = match made {
                    Ok(ref made) => (202, format!("{} deliveries made", made.len())),
                    Err(ref e) => {
                        let said = e.to_string();
                        (status_of(e), said)
                    }
                };
                engine.audit_end(&audit_id, status, &result).await?;
                let made = made?;
                for d in &made {
                    println!("{} to {} (sent by a running serve or worker)", d.id, d.endpoint_id);
                }
                println!("({} deliveries made)", made.len());
            }
        }
        Ok(())
    }
}
