//! What events, endpoints, deliveries and attempts are made of: their types and ids, the event as the outbox
//! writes it ([`NewEvent`]) and as it is read back ([`Event`]), and a position in the event log ([`Position`]).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What happened: the `type` of an event (`contracts/events.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum EventType {
    /// A payment is charged and its order paid.
    #[serde(rename = "payment.succeeded")]
    PaymentSucceeded,
    /// The channel declined it (the order is payable again).
    #[serde(rename = "payment.declined")]
    PaymentDeclined,
    /// It ended with nothing charged for any other reason.
    #[serde(rename = "payment.failed")]
    PaymentFailed,
    /// It ended with its charge given back by a compensation.
    #[serde(rename = "payment.refunded")]
    PaymentRefunded,
    /// A merchant's refund succeeded.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
    /// A merchant's refund failed.
    #[serde(rename = "refund.failed")]
    RefundFailed,
}

impl EventType {
    /// Every type, in the contract's order.
    pub const ALL: [Self; 6] = [
        Self::PaymentSucceeded,
        Self::PaymentDeclined,
        Self::PaymentFailed,
        Self::PaymentRefunded,
        Self::RefundSucceeded,
        Self::RefundFailed,
    ];
}

/// Where a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Due now or at `next_attempt_at`, or in flight.
    Pending,
    /// An attempt was answered `2xx`.
    Delivered,
    /// Every attempt of its schedule failed, or its endpoint answered `410` or was disabled or deleted.
    Failed,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Sent, not answered yet.
    InFlight,
    /// Answered `2xx` within the timeout.
    Delivered,
    /// Anything else: a status, a timeout, a refused address, a lost connection.
    Failed,
    /// Its process stopped before it ended; the delivery was tried again.
    Abandoned,
}

onceflow_engine::stored_as_text! {
    EventType {
        PaymentSucceeded = "payment.succeeded",
        PaymentDeclined = "payment.declined",
        PaymentFailed = "payment.failed",
        PaymentRefunded = "payment.refunded",
        RefundSucceeded = "refund.succeeded",
        RefundFailed = "refund.failed",
    }
    DeliveryState { Pending = "pending", Delivered = "delivered", Failed = "failed" }
    AttemptOutcome { InFlight = "in_flight", Delivered = "delivered", Failed = "failed", Abandoned = "abandoned" }
}

/// `bytes` in Crockford's base32 (the alphabet of ULIDs: no I, L, O, U), most significant bit first.
fn crockford(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

/// `prefix` and 128 bits of SHA-256 over `parts`, each length-prefixed (no two lists of parts share an input).
pub(crate) fn derived_id(prefix: &str, parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(format!("{}:", part.len()).as_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    format!("{prefix}{}", crockford(&digest[..16]))
}

/// `prefix` and 128 random bits (two v4 UUIDs hashed: 244 random bits in, a uniform form out).
pub(crate) fn random_id(prefix: &str) -> String {
    let a = uuid::Uuid::new_v4();
    let b = uuid::Uuid::new_v4();
    derived_id(prefix, &[&a.simple().to_string(), &b.simple().to_string()])
}

/// The pattern of an event id: `evt_` and 26 characters of Crockford's base32.
pub const EVENT_ID_PATTERN: &str = "^evt_[0-9A-HJKMNP-TV-Z]{26}$";

/// The pattern of an endpoint id: `we_` and 26 characters of Crockford's base32.
pub const ENDPOINT_ID_PATTERN: &str = "^we_[0-9A-HJKMNP-TV-Z]{26}$";

/// Whether `id` has the shape `prefix` + 26 characters of Crockford's base32 (what this service gives): an id of
/// another shape names nothing, and is never sent to a database (a NUL byte is an error on Postgres).
pub fn well_formed(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|rest| {
        rest.len() == 26
            && rest.bytes().all(|b| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b)))
    })
}

/// An event as the outbox writes it, in the transaction of the outcome it reports.
///
/// Its id is derived from the tenant and the outcome it reports ([`NewEvent::subject`]), never drawn: the event
/// table's unique key on the id is then a unique key on the outcome, so a second write of the same outcome (a
/// replayed commit, another process that drove the same payment, a bug) makes no second event, whatever its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The tenant whose event it is.
    pub tenant: String,
    /// What happened.
    pub kind: EventType,
    /// What ended, once: `payment:<request_no>` or `refund:<refund_no>` (see [`NewEvent::payment`]).
    pub subject: String,
    /// The payment or refund as its `GET` answers it at this moment (JSON).
    pub data: String,
    /// When (ms since the epoch).
    pub created_at: i64,
    /// The W3C trace context of the payment, when it was traced.
    pub traceparent: Option<String>,
}

impl NewEvent {
    /// The end of the tenant's payment `request_no`: one per payment, whichever of the payment types it is. It
    /// carries the trace context of the span it is made in (the payment's step), which its deliveries send on as
    /// `traceparent`: a receiver's work joins the payment's trace.
    pub fn payment(tenant: &str, request_no: &str, kind: EventType, data: String, now: i64) -> Self {
        let subject = format!("payment:{request_no}");
        let traceparent = onceflow_engine::trace::current();
        Self { tenant: tenant.to_owned(), kind, subject, data, created_at: now, traceparent }
    }

    /// The end of the tenant's refund `refund_no`: one per refund, with the trace context of the span it is made
    /// in, as [`NewEvent::payment`].
    pub fn refund(tenant: &str, refund_no: &str, kind: EventType, data: String, now: i64) -> Self {
        let subject = format!("refund:{refund_no}");
        let traceparent = onceflow_engine::trace::current();
        Self { tenant: tenant.to_owned(), kind, subject, data, created_at: now, traceparent }
    }

    /// Its id: `evt_` and 128 bits of SHA-256 over the tenant and the subject.
    pub fn id(&self) -> String {
        derived_id("evt_", &[&self.tenant, &self.subject])
    }
}

/// A place in the event log: the events are in commit order, `(major, id)` ascending. `major` is the writing
/// transaction's id on Postgres, the number the event was given on SQLite (its row) and MySQL (the sequencer's);
/// `id` orders the events of one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// The transaction or sequence number.
    pub major: i64,
    /// The event id (empty: before every event of `major`).
    pub id: String,
}

/// The pattern of a cursor of the event log.
pub const CURSOR_PATTERN: &str = r"^(0|[1-9][0-9]{0,17})\.(evt_[0-9A-HJKMNP-TV-Z]{26})?$";

impl Position {
    /// The start of the log.
    pub fn start() -> Self {
        Self::default()
    }

    /// As a client's cursor: `<major>.<event id>` (opaque to clients).
    pub fn cursor(&self) -> String {
        format!("{}.{}", self.major, self.id)
    }

    /// A cursor in the shape [`Position::cursor`] writes; anything else is `None`.
    pub fn parse(cursor: &str) -> Option<Self> {
        let (major, id) = cursor.split_once('.')?;
        let digits = major == "0" || (!major.starts_with('0') && (1..=18).contains(&major.len()));
        if !digits || !major.bytes().all(|b| b.is_ascii_digit()) || !(id.is_empty() || well_formed(id, "evt_")) {
            return None;
        }
        Some(Self { major: major.parse().ok()?, id: id.to_owned() })
    }
}

/// An event as kept.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Event {
    /// `evt_…`: the same in every delivery.
    pub id: String,
    /// Whose.
    pub tenant: String,
    /// What happened.
    #[sqlx(rename = "type")]
    pub kind: EventType,
    /// The payment or refund, as JSON.
    pub data: String,
    /// When (ms since the epoch).
    pub created_at: i64,
    /// The payment's trace context, if any.
    pub traceparent: Option<String>,
    /// Its place in the log (`major`; with the id, the position).
    pub position: i64,
}

impl Event {
    /// Where it is in the log.
    pub fn position(&self) -> Position {
        Position { major: self.position, id: self.id.clone() }
    }

    /// Its data as JSON: the object the outbox wrote (an empty object for data that does not parse, which no
    /// writer of this service makes: the log and the deliveries show the same then).
    pub fn data(&self) -> serde_json::Value {
        serde_json::from_str(&self.data).unwrap_or_else(|_| serde_json::json!({}))
    }

    /// The event as delivered and listed: `{"id", "type", "created_at", "tenant", "data"}`.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "type": self.kind,
            "created_at": rfc3339(self.created_at),
            "tenant": self.tenant,
            "data": self.data(),
        })
    }
}

/// `ms` since the epoch as RFC 3339 with milliseconds, in UTC.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// A tenant's webhook endpoint as kept. Its `Debug` leaves the secrets out.
#[derive(Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Endpoint {
    /// `we_…`.
    pub id: String,
    /// Whose.
    pub tenant: String,
    /// Where events are posted.
    pub url: String,
    /// The types it is subscribed to, as a JSON array; `None`: every type.
    pub events: Option<String>,
    /// `whsec_<base64>`: signs every delivery.
    pub secret: String,
    /// The secret before the last rotation, which signs too until `previous_until`.
    pub previous_secret: Option<String>,
    /// When the previous secret stops signing (ms).
    pub previous_until: Option<i64>,
    /// Whether events are delivered to it.
    pub enabled: bool,
    /// Why it was disabled: `gone` (it answered `410`) or `disabled` (by its tenant).
    pub disabled_reason: Option<String>,
    /// Created (ms).
    pub created_at: i64,
    /// Last changed (ms).
    pub updated_at: i64,
}

impl Endpoint {
    /// The types it is subscribed to; `None`: every type.
    pub fn types(&self) -> Option<Vec<EventType>> {
        self.events.as_deref().map(|raw| serde_json::from_str(raw).unwrap_or_default())
    }

    /// Whether events of `kind` are delivered to it (when enabled).
    pub fn wants(&self, kind: EventType) -> bool {
        self.types().is_none_or(|types| types.contains(&kind))
    }

    /// The secrets that sign a delivery at `now`: the current one, and the previous one during a rotation.
    pub fn signing_secrets(&self, now: i64) -> Vec<&str> {
        signing_secrets(&self.secret, self.previous_secret.as_deref(), self.previous_until, now)
    }
}

/// The secrets that sign at `now`: `secret`, and `previous` until `until` (a rotation's overlap).
fn signing_secrets<'a>(secret: &'a str, previous: Option<&'a str>, until: Option<i64>, now: i64) -> Vec<&'a str> {
    let mut secrets = vec![secret];
    if let (Some(previous), Some(until)) = (previous, until)
        && now < until
    {
        secrets.push(previous);
    }
    secrets
}

/// What `Debug` shows of a secret: whether there is one.
const REDACTED: &str = "[redacted]";

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("tenant", &self.tenant)
            .field("url", &self.url)
            .field("events", &self.events)
            .field("secret", &REDACTED)
            .field("previous_secret", &self.previous_secret.as_ref().map(|_| REDACTED))
            .field("previous_until", &self.previous_until)
            .field("enabled", &self.enabled)
            .field("disabled_reason", &self.disabled_reason)
            .field("created_at", &self.created_at)
            .field("updated_at", &self.updated_at)
            .finish()
    }
}

/// A change to an endpoint: each field given is written, nothing else (a `PATCH` and a rotation at the same time
/// each keep what the other wrote; a `PATCH` that does not name `enabled` never enables one a `410` disabled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointChange {
    /// A new URL (already checked).
    pub url: Option<String>,
    /// New subscriptions as stored: `Some(None)` for every type.
    pub events: Option<Option<String>>,
    /// Enabled or disabled; disabling fails the endpoint's pending deliveries.
    pub enabled: Option<bool>,
}

/// One event to one endpoint, as kept.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Delivery {
    /// `whd_…`.
    pub id: String,
    /// The event.
    pub event_id: String,
    /// The endpoint.
    pub endpoint_id: String,
    /// Whose.
    pub tenant: String,
    /// Where it is.
    pub state: DeliveryState,
    /// Attempts made (counting one in flight).
    pub attempts: i32,
    /// How many times it was claimed: the fence of the claimer's writes.
    pub claim: i64,
    /// When it is due (ms, by the database's clock); while an attempt is in flight, the end of its lease.
    pub next_attempt_at: i64,
    /// The waits (ms) between attempts, comma-separated, as when it was created.
    pub schedule: String,
    /// The last attempt's status code, if it got one.
    pub last_status: Option<i32>,
    /// The last attempt's error, if it failed.
    pub last_error: Option<String>,
    /// Created (ms).
    pub created_at: i64,
    /// Last changed (ms).
    pub updated_at: i64,
}

/// A delivery to make, due at once: the dispatcher's for an event and an endpoint subscribed to it (its id
/// derived from both, so dispatching an event twice makes one delivery), or a redelivery's (its id drawn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// `whd_…`.
    pub id: String,
    /// The event.
    pub event_id: String,
    /// The endpoint.
    pub endpoint_id: String,
    /// Whose.
    pub tenant: String,
    /// Made (ms, by this process's clock; it is due at once by the database's).
    pub created_at: i64,
    /// Its schedule (ms, comma-separated).
    pub schedule: String,
}

impl NewDelivery {
    /// The dispatcher's delivery of `event_id` to `endpoint_id`.
    pub fn dispatched(event_id: &str, endpoint_id: &str, tenant: &str, now: i64, schedule: &str) -> Self {
        Self {
            id: derived_id("whd_", &[event_id, endpoint_id]),
            event_id: event_id.to_owned(),
            endpoint_id: endpoint_id.to_owned(),
            tenant: tenant.to_owned(),
            created_at: now,
            schedule: schedule.to_owned(),
        }
    }

    /// A redelivery of `event_id` to `endpoint_id`, asked for now.
    pub fn redelivery(event_id: &str, endpoint_id: &str, tenant: &str, now: i64, schedule: &str) -> Self {
        Self { id: random_id("whd_"), ..Self::dispatched(event_id, endpoint_id, tenant, now, schedule) }
    }
}

/// One attempt of a delivery, as kept.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Attempt {
    /// The delivery.
    pub delivery_id: String,
    /// 1, 2, …
    pub attempt: i32,
    /// The endpoint.
    pub endpoint_id: String,
    /// The event.
    pub event_id: String,
    /// Whose.
    pub tenant: String,
    /// How it ended, or in flight.
    pub outcome: AttemptOutcome,
    /// Started (ms).
    pub started_at: i64,
    /// Ended (ms).
    pub finished_at: Option<i64>,
    /// The endpoint's status code, if it answered.
    pub status_code: Option<i32>,
    /// How long it took (ms).
    pub latency_ms: Option<i64>,
    /// What went wrong.
    pub error: Option<String>,
    /// When the next attempt is due, if there is one.
    pub next_attempt_at: Option<i64>,
}

/// A delivery claimed for one attempt, with what sending it takes. Its `Debug` leaves the secrets out.
#[derive(Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Claimed {
    /// The delivery, as the claim left it.
    #[sqlx(flatten)]
    pub delivery: Delivery,
    /// The endpoint's URL.
    pub url: String,
    /// The endpoint's secret.
    pub secret: String,
    /// The previous secret, during a rotation.
    pub previous_secret: Option<String>,
    /// Until when the previous secret signs.
    pub previous_until: Option<i64>,
    /// The event's type.
    pub event_type: EventType,
    /// The event's data.
    pub event_data: String,
    /// The event's time.
    pub event_created_at: i64,
    /// The event's trace context.
    pub traceparent: Option<String>,
}

impl std::fmt::Debug for Claimed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claimed")
            .field("delivery", &self.delivery)
            .field("url", &self.url)
            .field("secret", &REDACTED)
            .field("previous_secret", &self.previous_secret.as_ref().map(|_| REDACTED))
            .field("previous_until", &self.previous_until)
            .field("event_type", &self.event_type)
            .field("event_created_at", &self.event_created_at)
            .field("traceparent", &self.traceparent)
            .finish_non_exhaustive()
    }
}

impl Claimed {
    /// The secrets that sign its attempt at `now` (as [`Endpoint::signing_secrets`]).
    pub fn signing_secrets(&self, now: i64) -> Vec<&str> {
        signing_secrets(&self.secret, self.previous_secret.as_deref(), self.previous_until, now)
    }

    /// The event it delivers.
    pub fn event(&self) -> Event {
        Event {
            id: self.delivery.event_id.clone(),
            tenant: self.delivery.tenant.clone(),
            kind: self.event_type,
            data: self.event_data.clone(),
            created_at: self.event_created_at,
            traceparent: self.traceparent.clone(),
            position: 0,
        }
    }
}

/// How an attempt ended, as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptResult {
    /// Delivered or failed.
    pub outcome: AttemptOutcome,
    /// The status code, if answered.
    pub status_code: Option<i32>,
    /// What went wrong.
    pub error: Option<String>,
    /// How long it took (ms).
    pub latency_ms: i64,
    /// Ended (ms).
    pub finished_at: i64,
    /// The wait (ms) before the next attempt, counted on the database's clock when it is recorded; `None`: no
    /// more (delivered, or failed for good).
    pub retry_in: Option<i64>,
    /// The endpoint answered `410 Gone`: disable it.
    pub gone: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_derived_from_the_outcome_and_well_formed() {
        let data = "{}".to_owned();
        let a = NewEvent::payment("acme", "R-1", EventType::PaymentSucceeded, data.clone(), 1);
        let b = NewEvent::payment("acme", "R-1", EventType::PaymentFailed, data.clone(), 2);
        let c = NewEvent::payment("acme2", "R-1", EventType::PaymentSucceeded, data.clone(), 1);
        let d = NewEvent::refund("acme", "R-1", EventType::RefundSucceeded, data, 1);
        assert_eq!(a.id(), b.id(), "one event per payment's end, whatever its type");
        assert_ne!(a.id(), c.id());
        assert_ne!(a.id(), d.id());
        assert!(well_formed(&a.id(), "evt_"), "{}", a.id());
        assert!(well_formed(&random_id("we_"), "we_"));
        assert_ne!(random_id("we_"), random_id("we_"));
    }

    #[test]
    fn debug_leaves_the_secrets_out() {
        let endpoint = Endpoint {
            id: random_id("we_"),
            tenant: "acme".into(),
            url: "https://hooks.example/".into(),
            events: None,
            secret: "whsec_current".into(),
            previous_secret: Some("whsec_previous".into()),
            previous_until: Some(2),
            enabled: true,
            disabled_reason: None,
            created_at: 1,
            updated_at: 1,
        };
        let delivery = Delivery {
            id: random_id("whd_"),
            event_id: random_id("evt_"),
            endpoint_id: endpoint.id.clone(),
            tenant: "acme".into(),
            state: DeliveryState::Pending,
            attempts: 1,
            claim: 1,
            next_attempt_at: 1,
            schedule: "100".into(),
            last_status: None,
            last_error: None,
            created_at: 1,
            updated_at: 1,
        };
        let claimed = Claimed {
            delivery,
            url: endpoint.url.clone(),
            secret: endpoint.secret.clone(),
            previous_secret: endpoint.previous_secret.clone(),
            previous_until: endpoint.previous_until,
            event_type: EventType::PaymentSucceeded,
            event_data: "{}".into(),
            event_created_at: 1,
            traceparent: None,
        };
        for shown in [format!("{endpoint:?}"), format!("{claimed:?}"), format!("{claimed:#?}")] {
            assert!(!shown.contains("whsec_current") && !shown.contains("whsec_previous"), "{shown}");
            assert!(shown.contains("[redacted]") && shown.contains("hooks.example"), "{shown}");
        }
        assert_eq!(claimed.signing_secrets(1), ["whsec_current", "whsec_previous"]);
        assert_eq!(endpoint.signing_secrets(2), ["whsec_current"], "the previous one signs until its end");
    }

    #[test]
    fn cursors_round_trip_and_odd_ones_are_refused() {
        let p = Position { major: 42, id: NewEvent::payment("t", "R", EventType::PaymentFailed, "{}".into(), 0).id() };
        assert_eq!(Position::parse(&p.cursor()), Some(p));
        assert_eq!(Position::parse("0."), Some(Position::start()));
        for bad in ["", "0", ".", "01.", "-1.", "1.evt_x", "1.evt_0000000000000000000000000I", "x."] {
            assert_eq!(Position::parse(bad), None, "{bad}");
        }
        let re = CURSOR_PATTERN;
        assert!(re.starts_with('^') && re.ends_with('$'));
    }
}
