//! `onceflow events list [--tenant T] [--after C]` and `onceflow events redeliver <id> [--endpoint we_…]
//! [--webhook-retry-schedule …]`: the event log and a redelivery from a terminal, with what `GET /v1/events` and
//! `POST /v1/events/{id}/redeliver` give an operator. A redelivery stores its schedule with it, so the command
//! takes the serving processes' event flags.

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
            EventsCommand::Redeliver { event_id, endpoint, .. } => {
                let made = events.redeliver(None, &event_id, endpoint.as_deref()).await?;
                for d in &made {
                    println!("{} to {} (sent by a running serve or worker)", d.id, d.endpoint_id);
                }
                println!("({} deliveries made)", made.len());
            }
        }
        Ok(())
    }
}
