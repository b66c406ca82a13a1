//! Where events, endpoints, deliveries and attempts are kept: the [`EventStore`] trait, implemented once for the
//! two backends that share SQL text (`standard.rs`, with what differs in `postgres.rs` and `sqlite.rs`: how the
//! log is ordered in commit order, how rows are locked, the database's clock) and once for MySQL (`mysql.rs`);
//! and what the implementations share (below), which is not SQL.
//!
//! Who may remove a row another is about to use, and how each is kept from leaving a delivery without its
//! event or endpoint:
//! - retention deletes an event a redelivery is about to be made for: the redelivery locks the event's row (for
//!   share) before it inserts, retention locks it (for update) before it checks that nothing is pending and
//!   deletes — whichever comes second sees what the first did;
//! - a tenant deletes or disables an endpoint the dispatcher is making deliveries to: the dispatcher reads the
//!   enabled endpoints locked for share, the delete / disable locks the row and then fails what is pending;
//! - whatever is left anyway (rows older than these locks) is failed by a claim that finds its event gone, and
//!   by the retention pass for endpoints gone or disabled: no pending delivery lasts without a way out.

use std::future::Future;

use onceflow_engine::{BoxFuture, Conn, StepError, Store};

use super::model::{
    Attempt, AttemptOutcome, AttemptResult, Claimed, Delivery, DeliveryState, Endpoint, EndpointChange, Event,
    EventType, NewDelivery, NewEvent, Position,
};

mod mysql;
mod postgres;
mod sqlite;
mod standard;

/// A transactional step's body as the store's queries give it (the outbox's write in a closure step).
pub type Sql<'c, T> = BoxFuture<'c, Result<T, StepError>>;

/// Whose rows a read covers: one tenant's, or every tenant's (an operator).
pub type Scope<'a> = Option<&'a str>;

/// What one retention batch of events did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventBatch {
    /// Events deleted (with their deliveries and attempts).
    pub deleted: u64,
    /// Whether the batch reached events too young (or not yet dispatched): the pass stops there.
    pub done: bool,
}

/// A page of the log as the store reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogPage {
    /// The events asked for, in commit order.
    pub events: Vec<Event>,
    /// When fewer events than the limit were found: the newest position of the scope's log shown at that moment
    /// (of any type), read with the page, so a cursor may move past the events a type filter left out.
    pub end: Option<Position>,
}

/// The session whose transaction holds the Postgres log back: nothing committed after it began shows in the log,
/// nor is delivered, until it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its backend's process id (`pg_stat_activity.pid`).
    pub pid: i32,
    /// When its transaction began (ms).
    pub xact_start: Option<i64>,
    /// `active`, `idle in transaction`, …
    pub state: Option<String>,
}

/// A store that also keeps merchant events: the outbox, the event log, webhook endpoints and deliveries.
///
/// The outbox is written inside the transaction of the outcome it reports: [`EventStore::write_event`] in a
/// closure step's transaction (every backend), or `events::outbox::phase_insert` in a statement phase (Postgres,
/// SQLite). Everything else runs outside any payment's transaction, in the background or on request.
///
/// Times of due deliveries (`next_attempt_at`) are the database's clock wherever it has one (a lease must mean
/// the same to every process that reads it); the other times are the caller's, for display.
pub trait EventStore: Store {
    /// Writes `event` in the caller's transaction (a transactional step's connection), unless an event for its
    /// outcome exists (the same id): whether it wrote it.
    fn write_event<'c>(conn: &'c mut Conn<Self>, event: &NewEvent) -> Sql<'c, bool>;

    /// Gives log positions to events committed without one (MySQL's sequencer: see its migration); how many. A
    /// no-op elsewhere, where the position is known at commit.
    fn sequence(&self) -> impl Future<Output = Result<u64, sqlx::Error>> + Send {
        async { Ok(0) }
    }

    /// Up to `limit` events of `scope` after `after` in commit order (of `types`, when not empty), only among
    /// those no later commit can precede; with the log's end when the page is not full.
    fn events_after(
        &self,
        scope: Scope<'_>,
        after: &Position,
        types: &[EventType],
        limit: i64,
    ) -> impl Future<Output = Result<LogPage, sqlx::Error>> + Send;

    /// One event.
    fn event(&self, id: &str) -> impl Future<Output = Result<Option<Event>, sqlx::Error>> + Send;

    /// The position of the newest event of `scope` the retention pass deleted.
    fn horizon(&self, scope: Scope<'_>) -> impl Future<Output = Result<Option<Position>, sqlx::Error>> + Send;

    /// Stores a new endpoint.
    fn insert_endpoint(&self, endpoint: &Endpoint) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// One endpoint.
    fn endpoint(&self, id: &str) -> impl Future<Output = Result<Option<Endpoint>, sqlx::Error>> + Send;

    /// The endpoints of `scope`, oldest first, at most `limit`.
    fn endpoints(
        &self,
        scope: Scope<'_>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Endpoint>, sqlx::Error>> + Send;

    /// Writes the fields `change` names (and `updated_at`), nothing else; disabling fails the endpoint's pending
    /// deliveries in the same transaction. The endpoint as it is then, if it exists.
    fn update_endpoint(
        &self,
        id: &str,
        change: &EndpointChange,
        now: i64,
    ) -> impl Future<Output = Result<Option<Endpoint>, sqlx::Error>> + Send;

    /// Makes `secret` the endpoint's secret, the current one its previous one (signing too until `until`), in
    /// one statement. The endpoint as it is then, if it exists.
    fn rotate_secret(
        &self,
        id: &str,
        secret: &str,
        until: i64,
        now: i64,
    ) -> impl Future<Output = Result<Option<Endpoint>, sqlx::Error>> + Send;

    /// Deletes an endpoint; its pending deliveries fail. Whether it existed.
    fn delete_endpoint(&self, id: &str, now: i64) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Makes deliveries, due at once, each only while its event exists and its endpoint is enabled (both rows
    /// locked for share meanwhile); one already made under an id is left as it is. Whether each was made.
    fn insert_deliveries(
        &self,
        deliveries: &[NewDelivery],
    ) -> impl Future<Output = Result<Vec<bool>, sqlx::Error>> + Send;

    /// An event's deliveries, oldest first.
    fn deliveries_of(&self, event_id: &str) -> impl Future<Output = Result<Vec<Delivery>, sqlx::Error>> + Send;

    /// An endpoint's attempts, newest first, before `(started_at, delivery_id, attempt)` when given.
    fn attempts_of(
        &self,
        endpoint_id: &str,
        before: Option<&(i64, String, i32)>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Attempt>, sqlx::Error>> + Send;

    /// The dispatcher's pass: turns up to `limit` events after its cursor (in commit order) into deliveries to
    /// the enabled endpoints of their tenant subscribed to them (created before the event; read locked for
    /// share, so none is deleted or disabled under it), with `schedule`, and moves the cursor past them — in
    /// one transaction, one process at a time. How many events it dispatched.
    fn dispatch(&self, limit: i64, now: i64, schedule: &str) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The enabled endpoints with a delivery due (by the database's clock), with their tenants.
    fn due_endpoints(&self) -> impl Future<Output = Result<Vec<(String, String)>, sqlx::Error>> + Send;

    /// Claims up to `limit` deliveries of `endpoint_id` due by the database's clock for one attempt each,
    /// leased for `lease_ms` from the database's clock (another process's claim skips them, and takes them again
    /// only once that has passed); each attempt is recorded in flight, and one a stopped process left in flight
    /// is recorded abandoned. A due delivery whose event is gone, or whose endpoint is gone or disabled, is
    /// failed instead (it could never be sent).
    fn claim(
        &self,
        endpoint_id: &str,
        limit: i64,
        now: i64,
        lease_ms: i64,
    ) -> impl Future<Output = Result<Vec<Claimed>, sqlx::Error>> + Send;

    /// Gives back a claim whose attempt was not sent (too little of its lease was left): the attempt is
    /// recorded abandoned and the delivery due again at once, while the claim holds. Whether it held.
    fn give_back(&self, claimed: &Claimed, now: i64) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Records how a claimed attempt ended; the delivery moves on (delivered, due again, failed) only while the
    /// claim holds. A `410` disables the endpoint and fails its pending deliveries. Whether the claim held.
    fn finish(
        &self,
        claimed: &Claimed,
        result: &AttemptResult,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// How many deliveries are pending, and the oldest one's creation time (ms).
    fn pending(&self) -> impl Future<Output = Result<(i64, Option<i64>), sqlx::Error>> + Send;

    /// The creation time (ms) of the first event in log order the dispatcher has not passed — committed but not
    /// shown yet included (on Postgres, held back by an older transaction still running).
    fn undispatched(&self) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;

    /// The session holding the log back, where a backend's log can be held (Postgres: the oldest transaction of
    /// this database with a transaction id).
    fn log_held_by(&self) -> impl Future<Output = Result<Option<Holder>, sqlx::Error>> + Send {
        async { Ok(None) }
    }

    /// Fails the pending deliveries whose endpoint is gone or disabled (the retention pass: what no lock
    /// prevented must still end); how many.
    fn fail_stranded(&self, now: i64) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// One retention batch: of the (at most `limit`) oldest events in log order after `from`, deletes those
    /// created at or before `by` that the dispatcher has passed and that have no pending delivery, with their
    /// deliveries and attempts (a few statements, whatever the batch's size), and moves each tenant's horizon
    /// past them. `from` is moved past the batch.
    fn delete_events(
        &self,
        from: &mut Position,
        by: i64,
        limit: i64,
        dry_run: bool,
    ) -> impl Future<Output = Result<EventBatch, sqlx::Error>> + Send;
}

/// The deliveries the dispatcher makes for `events`: each to every enabled endpoint of its tenant subscribed to
/// its type and created no later than it.
pub(crate) fn plan(events: &[Event], endpoints: &[Endpoint], now: i64, schedule: &str) -> Vec<NewDelivery> {
    let mut deliveries = Vec::new();
    for event in events {
        for endpoint in endpoints {
            if endpoint.enabled
                && endpoint.tenant == event.tenant
                && endpoint.created_at <= event.created_at
                && endpoint.wants(event.kind)
            {
                deliveries.push(NewDelivery::dispatched(&event.id, &endpoint.id, &event.tenant, now, schedule));
            }
        }
    }
    deliveries
}

/// Why a `410` failed the endpoint's pending deliveries.
const GONE: &str = "the endpoint answered 410 Gone and was disabled";
/// Why deleting an endpoint failed its pending deliveries.
const DELETED: &str = "the endpoint was deleted";
/// Why disabling an endpoint failed its pending deliveries.
const DISABLED: &str = "the endpoint was disabled";
/// Why a claim failed a delivery whose event is gone.
const EVENT_GONE: &str = "the event was deleted";
/// Why a delivery whose endpoint is gone or disabled was failed.
const STRANDED: &str = "the endpoint was deleted or disabled";
/// Why an attempt in flight was abandoned by a later claim.
const ABANDONED: &str = "the process sending it stopped before it was answered";
/// Why a claimed attempt was given back unsent.
const UNSENT: &str = "not sent: too little of its claim's lease was left to send it within";

/// Where an attempt leaves its delivery.
fn delivery_state(r: &AttemptResult) -> DeliveryState {
    match (r.outcome, r.retry_in) {
        (AttemptOutcome::Delivered, _) => DeliveryState::Delivered,
        (_, Some(_)) => DeliveryState::Pending,
        (_, None) => DeliveryState::Failed,
    }
}

/// Of a retention window (`(id, tenant, position, created_at, pending)` in log order), the events to delete —
/// old enough, passed by the dispatcher, nothing pending — and whether the pass is done (it reached an event too
/// young or not yet dispatched, or the end of the log). `from` moves past what was looked at.
fn choose(
    window: &[(String, String, i64, i64, bool)],
    dispatched: &Position,
    by: i64,
    limit: i64,
    from: &mut Position,
) -> (Vec<(String, String, Position)>, bool) {
    let mut doomed = Vec::new();
    for (id, tenant, major, created_at, pending) in window {
        let position = Position { major: *major, id: id.clone() };
        if *created_at > by || position > *dispatched {
            return (doomed, true);
        }
        *from = position.clone();
        if !pending {
            doomed.push((id.clone(), tenant.clone(), position));
        }
    }
    (doomed, (window.len() as i64) < limit)
}

/// Each tenant's newest deleted position.
fn horizons(doomed: &[(String, String, Position)]) -> Vec<(String, Position)> {
    let mut newest: std::collections::BTreeMap<String, Position> = std::collections::BTreeMap::new();
    for (_, tenant, position) in doomed {
        let entry = newest.entry(tenant.clone()).or_default();
        if *position > *entry {
            *entry = position.clone();
        }
    }
    newest.into_iter().collect()
}

/// The page and the log's end from the rows of a log query: events, then (flagged) the newest one shown.
fn log_page(rows: Vec<LogRow>, limit: i64) -> LogPage {
    let mut page = LogPage::default();
    for row in rows {
        if row.tail == 0 {
            page.events.push(row.event);
        } else if (page.events.len() as i64) < limit {
            page.end = Some(row.event.position());
        }
    }
    page
}

/// A row of a log query: an event of the page (`tail` 0), or the newest event shown (`tail` 1).
#[derive(sqlx::FromRow)]
struct LogRow {
    #[sqlx(flatten)]
    event: Event,
    tail: i64,
}

/// `n` placeholders from `$first` (`$3, $4, …`), for an `IN` list on Postgres and SQLite.
fn numbered(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// The database error inside an engine error (beginning a transaction fails only on the database).
fn engine(e: onceflow_engine::Error) -> sqlx::Error {
    match e {
        onceflow_engine::Error::Database(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_from_the_first() {
        assert_eq!(numbered(3, 3), "$3, $4, $5");
        assert_eq!(numbered(1, 1), "$1");
    }
}
