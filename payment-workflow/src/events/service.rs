//! The events front, `Events`: a tenant's webhook endpoints, its event log, redeliveries, the delivery loop and
//! the events' retention. Tenants see only their own: another tenant's endpoint or event is not found, as one
//! that does not exist.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::Engine;

use super::address::Refusal;
use super::delivery::dispatch_all;
use super::model::{
    Attempt, Delivery, Endpoint, EndpointChange, Event, EventType, NewDelivery, Position, random_id, well_formed,
};
use super::settings::EventSettings;
use super::signing::new_secret;
use super::store::{EventStore, Scope};
use crate::settings::millis;

/// How long the previous secret keeps signing after a rotation.
pub const ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// Endpoints a tenant may have.
pub const MAX_ENDPOINTS: i64 = 100;

/// Events per page of the log at most.
pub const MAX_PAGE: i64 = 1000;

/// Why an events request is not answered as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// No such endpoint (or another tenant's).
    #[error("no webhook endpoint {0}")]
    EndpointNotFound(String),
    /// No such event (or another tenant's).
    #[error("no event {0}")]
    EventNotFound(String),
    /// The URL breaks a rule (`422 webhook_url_refused`).
    #[error(transparent)]
    UrlRefused(#[from] Refusal),
    /// The cursor is older than the oldest event kept (`410 cursor_expired`).
    #[error("the cursor is older than the oldest event kept: events after it were deleted; start again without one")]
    CursorExpired,
    /// The tenant has [`MAX_ENDPOINTS`] endpoints already (`422 endpoint_limit`).
    #[error("a tenant has at most {MAX_ENDPOINTS} webhook endpoints")]
    TooManyEndpoints,
    /// A redelivery to a disabled endpoint (`409 endpoint_disabled`).
    #[error("webhook endpoint {0} is disabled; enable it first")]
    EndpointDisabled(String),
    /// Storage failed (`503`).
    #[error("storage unavailable")]
    Database(#[from] sqlx::Error),
}

/// The change `PATCH /v1/webhook-endpoints/{id}` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointPatch {
    /// A new URL (checked as at registration).
    pub url: Option<String>,
    /// New subscriptions: `Some(None)` for every type.
    pub events: Option<Option<Vec<EventType>>>,
    /// Enabled or disabled (enabling again one a `410` disabled).
    pub enabled: Option<bool>,
}

/// A page of the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPage {
    /// The events, in commit order.
    pub events: Vec<Event>,
    /// Where the next page starts: always given (poll from it).
    pub next: Position,
}

/// The events front over the payment service's engine and store. Cheap to clone.
pub struct Events<S: EventStore> {
    engine: Engine<S>,
    settings: Arc<EventSettings>,
}

impl<S: EventStore> Clone for Events<S> {
    fn clone(&self) -> Self {
        Self { engine: self.engine.clone(), settings: self.settings.clone() }
    }
}

/// Whether `scope` may see a row of `tenant`.
fn sees(scope: Scope<'_>, tenant: &str) -> bool {
    scope.is_none_or(|s| s == tenant)
}

impl<S: EventStore> Events<S> {
    /// The front over `engine`'s store and clock.
    pub fn new(engine: Engine<S>, settings: Arc<EventSettings>) -> Self {
        Self { engine, settings }
    }

    /// The settings in force.
    pub fn settings(&self) -> &EventSettings {
        &self.settings
    }

    fn store(&self) -> &S {
        self.engine.store()
    }

    fn now(&self) -> i64 {
        self.engine.now_ms()
    }

    /// Registers an endpoint of `tenant` at `url` for `events` (every type when `None`), after checking the URL
    /// (resolving its name). The answer carries the secret, which is shown this once.
    pub async fn create_endpoint(
        &self,
        tenant: &str,
        url: &str,
        events: Option<Vec<EventType>>,
    ) -> Result<Endpoint, EventError> {
        let url = self.settings.rules.check(url, self.settings.resolver.as_ref()).await?;
        if self.store().endpoints(Some(tenant), MAX_ENDPOINTS).await?.len() as i64 >= MAX_ENDPOINTS {
            return Err(EventError::TooManyEndpoints);
        }
        let now = self.now();
        let endpoint = Endpoint {
            id: random_id("we_"),
            tenant: tenant.to_owned(),
            url: url.to_string(),
            events: subscriptions(events),
            secret: new_secret(),
            previous_secret: None,
            previous_until: None,
            enabled: true,
            disabled_reason: None,
            created_at: now,
            updated_at: now,
        };
        self.store().insert_endpoint(&endpoint).await?;
        Ok(endpoint)
    }

    /// One endpoint `scope` may see. An id of a shape this service never gives names none (and is not looked
    /// up: a NUL byte in it is an error on Postgres, not a client's mistake).
    pub async fn endpoint(&self, scope: Scope<'_>, id: &str) -> Result<Endpoint, EventError> {
        if !well_formed(id, "we_") {
            return Err(EventError::EndpointNotFound(id.to_owned()));
        }
        match self.store().endpoint(id).await? {
            Some(e) if sees(scope, &e.tenant) => Ok(e),
            _ => Err(EventError::EndpointNotFound(id.to_owned())),
        }
    }

    /// The endpoints `scope` sees, oldest first.
    pub async fn endpoints(&self, scope: Scope<'_>) -> Result<Vec<Endpoint>, EventError> {
        let limit = if scope.is_some() { MAX_ENDPOINTS } else { 10 * MAX_PAGE };
        Ok(self.store().endpoints(scope, limit).await?)
    }

    /// Changes an endpoint of `scope`: only the fields `patch` names (a rotation at the same time keeps its
    /// secret; an endpoint a `410` disables meanwhile stays disabled unless `patch` enables it). Disabling it
    /// fails its pending deliveries, as deleting it does.
    pub async fn update_endpoint(
        &self,
        scope: Scope<'_>,
        id: &str,
        patch: EndpointPatch,
    ) -> Result<Endpoint, EventError> {
        self.endpoint(scope, id).await?;
        let url = match patch.url {
            Some(url) => Some(self.settings.rules.check(&url, self.settings.resolver.as_ref()).await?.to_string()),
            None => None,
        };
        let change = EndpointChange { url, events: patch.events.map(subscriptions), enabled: patch.enabled };
        self.store()
            .update_endpoint(id, &change, self.now())
            .await?
            .ok_or_else(|| EventError::EndpointNotFound(id.to_owned()))
    }

    /// Deletes an endpoint of `scope`; its pending deliveries fail.
    pub async fn delete_endpoint(&self, scope: Scope<'_>, id: &str) -> Result<(), EventError> {
        self.endpoint(scope, id).await?;
        if self.store().delete_endpoint(id, self.now()).await? {
            Ok(())
        } else {
            Err(EventError::EndpointNotFound(id.to_owned()))
        }
    }

    /// Gives an endpoint of `scope` a new secret (in the answer, shown this once); the old one keeps signing
    /// beside it for [`ROTATION_OVERLAP`]. Only the secrets are written (a `PATCH` at the same time keeps its
    /// change).
    pub async fn rotate_secret(&self, scope: Scope<'_>, id: &str) -> Result<Endpoint, EventError> {
        self.endpoint(scope, id).await?;
        let now = self.now();
        let until = now.saturating_add(millis(ROTATION_OVERLAP));
        self.store()
            .rotate_secret(id, &new_secret(), until, now)
            .await?
            .ok_or_else(|| EventError::EndpointNotFound(id.to_owned()))
    }

    /// A page of `scope`'s log after `after` (from the oldest event kept when `None`), of `types` (every type
    /// when empty): at most `limit` events in commit order, and where the next page starts. A cursor the
    /// retention pass has passed (events after it were deleted) is [`EventError::CursorExpired`].
    ///
    /// The next cursor is never one the retention pass had passed when it was given: the log starts at the
    /// retention's horizon (an event older than it, kept only while a delivery of it is pending, is not in the
    /// log, only at `GET /v1/events/{id}`), and a page shorter than `limit` moves the cursor to the newest
    /// event shown, of any type — so a client polling for a type that is rare keeps up with the log.
    pub async fn log(
        &self,
        scope: Scope<'_>,
        after: Option<Position>,
        types: &[EventType],
        limit: i64,
    ) -> Result<EventPage, EventError> {
        let store = self.store();
        store.sequence().await?;
        let limit = limit.clamp(1, MAX_PAGE);
        let given = after.is_some();
        let horizon = store.horizon(scope).await?;
        let start = match after {
            Some(after) if horizon.as_ref().is_some_and(|h| after < *h) => return Err(EventError::CursorExpired),
            Some(after) => after,
            None => horizon.unwrap_or_default(),
        };
        let page = store.events_after(scope, &start, types, limit).await?;
        // Retention may have passed the start while the page was read. A client's cursor is then expired: events
        // after it are gone, and the page may have skipped them. From the horizon (no cursor), what lies below
        // the new one was deleted or is out of the log anyway: the next cursor starts there at the earliest.
        let moved = store.horizon(scope).await?;
        if given && moved.as_ref().is_some_and(|h| start < *h) {
            return Err(EventError::CursorExpired);
        }
        let last = page.events.last().map(Event::position);
        let next = [Some(start), last, page.end, moved].into_iter().flatten().max().unwrap_or_default();
        Ok(EventPage { events: page.events, next })
    }

    /// One event `scope` may see, with its deliveries (an id of a shape this service never gives names none).
    pub async fn event(&self, scope: Scope<'_>, id: &str) -> Result<(Event, Vec<Delivery>), EventError> {
        if !well_formed(id, "evt_") {
            return Err(EventError::EventNotFound(id.to_owned()));
        }
        match self.store().event(id).await? {
            Some(event) if sees(scope, &event.tenant) => {
                let deliveries = self.store().deliveries_of(id).await?;
                Ok((event, deliveries))
            }
            _ => Err(EventError::EventNotFound(id.to_owned())),
        }
    }

    /// Sends an event of `scope` again now, with the same id: to `endpoint`, or to every enabled endpoint of its
    /// tenant subscribed to it. The deliveries made.
    pub async fn redeliver(
        &self,
        scope: Scope<'_>,
        id: &str,
        endpoint: Option<&str>,
    ) -> Result<Vec<NewDelivery>, EventError> {
        let (event, _) = self.event(scope, id).await?;
        let targets = match endpoint {
            Some(endpoint_id) => {
                let e = self.endpoint(Some(&event.tenant), endpoint_id).await?;
                if !e.enabled {
                    return Err(EventError::EndpointDisabled(e.id));
                }
                vec![e]
            }
            None => self
                .store()
                .endpoints(Some(&event.tenant), MAX_ENDPOINTS)
                .await?
                .into_iter()
                .filter(|e| e.enabled && e.wants(event.kind))
                .collect(),
        };
        let (now, schedule) = (self.now(), self.settings.stored_schedule());
        let deliveries: Vec<NewDelivery> =
            targets.iter().map(|e| NewDelivery::redelivery(&event.id, &e.id, &event.tenant, now, &schedule)).collect();
        // Each is made only while its event and its endpoint still are (retention, a delete or a disable may
        // have come since they were read).
        let made = self.store().insert_deliveries(&deliveries).await?;
        let made: Vec<NewDelivery> =
            deliveries.into_iter().zip(made).filter_map(|(d, made)| made.then_some(d)).collect();
        if made.is_empty() && !targets.is_empty() {
            if self.store().event(id).await?.is_none() {
                return Err(EventError::EventNotFound(id.to_owned()));
            }
            if let Some(endpoint_id) = endpoint {
                let e = self.endpoint(Some(&event.tenant), endpoint_id).await?;
                return Err(EventError::EndpointDisabled(e.id));
            }
        }
        Ok(made)
    }

    /// An endpoint's attempts (of `scope`), newest first.
    pub async fn attempts(
        &self,
        scope: Scope<'_>,
        endpoint_id: &str,
        before: Option<&(i64, String, i32)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, EventError> {
        self.endpoint(scope, endpoint_id).await?;
        Ok(self.store().attempts_of(endpoint_id, before, limit.clamp(1, MAX_PAGE + 1)).await?)
    }

    /// Starts the dispatcher and the deliveries in the background (`serve`, `worker`); abort the handle to stop
    /// them (an attempt in flight is then sent again by whichever process claims it after its lease).
    pub fn spawn(&self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(super::delivery::run(self.engine.clone(), self.settings.clone()))
    }

    /// One dispatcher pass now (what the delivery loop runs every poll): how many events it dispatched.
    pub async fn dispatch(&self) -> Result<u64, EventError> {
        Ok(dispatch_all(self.store(), self.now(), &self.settings.stored_schedule()).await?)
    }

    /// Deletes (or with `dry_run` counts) the events older than the retention that nothing pending holds,
    /// with their delivery records, `batch` at a time: how many. Deliveries left pending to an endpoint gone or
    /// disabled are failed first (they would hold their events for ever).
    pub async fn delete_old(&self, dry_run: bool, batch: i64) -> Result<u64, EventError> {
        let now = self.now();
        if !dry_run {
            let stranded = self.store().fail_stranded(now).await?;
            if stranded > 0 {
                tracing::warn!(stranded, "failed deliveries pending to endpoints deleted or disabled");
            }
        }
        let by = now.saturating_sub(millis(self.settings.retention));
        let mut from = Position::start();
        let mut total = 0;
        loop {
            let done = self.store().delete_events(&mut from, by, batch, dry_run).await?;
            total += done.deleted;
            if done.done {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }
}

/// Subscriptions as stored: a JSON array without repeats, or `None` for every type.
fn subscriptions(events: Option<Vec<EventType>>) -> Option<String> {
    events.map(|mut types| {
        types.sort_by_key(|t| EventType::ALL.iter().position(|a| a == t));
        types.dedup();
        serde_json::to_string(&types).unwrap_or_else(|_| "[]".to_owned())
    })
}
