//! The event log (`contracts/events.md`): `GET /v1/events` (keyset pages in commit order), `GET /v1/events/{id}`
//! with its deliveries, `POST /v1/events/{id}/redeliver`. A tenant key reads its own tenant's; an operator key
//! every tenant's, or one with `?tenant=`.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use onceflow_payments::PaymentStore;
use onceflow_payments::events::{Delivery, DeliveryState, Event, EventType, Position, rfc3339};

use crate::error::ApiError;
use crate::routes::audit::{self, ActionJson, Subject, audited};
use crate::state::{AppState, Caller};

/// An event: what every delivery posts, and what the log lists.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventBody {
    /// `evt_…`: the same in every delivery of the event (the `webhook-id` header).
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// Whose.
    pub tenant: String,
    /// The payment or refund, as its `GET` answered at that moment.
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

impl From<&Event> for EventBody {
    fn from(e: &Event) -> Self {
        Self {
            id: e.id.clone(),
            kind: e.kind,
            created_at: rfc3339(e.created_at),
            tenant: e.tenant.clone(),
            data: e.data(),
        }
    }
}

/// A page of the event log.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    /// In the order they were committed.
    pub events: Vec<EventBody>,
    /// Always present: the `after` of the next page, and what to poll from.
    pub next_cursor: String,
}

/// One event to one endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryBody {
    /// `whd_…`.
    pub id: String,
    /// The endpoint (`we_…`).
    pub endpoint: String,
    /// pending, delivered or failed.
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempts: i32,
    /// When the next attempt is due (RFC 3339); null once delivered or failed.
    #[schema(format = DateTime, required = true)]
    pub next_attempt_at: Option<String>,
    /// The last attempt's status code, if it got one.
    #[schema(required = true)]
    pub last_status: Option<i32>,
    /// The last attempt's error, if it failed.
    #[schema(required = true)]
    pub last_error: Option<String>,
    /// Created (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl From<Delivery> for DeliveryBody {
    fn from(d: Delivery) -> Self {
        Self {
            id: d.id,
            endpoint: d.endpoint_id,
            next_attempt_at: (d.state == DeliveryState::Pending).then(|| rfc3339(d.next_attempt_at)),
            state: d.state,
            attempts: d.attempts,
            last_status: d.last_status,
            last_error: d.last_error,
            created_at: rfc3339(d.created_at),
        }
    }
}

/// An event with its deliveries.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventDetail {
    /// `evt_…`.
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// Whose.
    pub tenant: String,
    /// The payment or refund, as its `GET` answered at that moment.
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
    /// Its deliveries, oldest first.
    pub deliveries: Vec<DeliveryBody>,
}

/// `POST /v1/events/{event_id}/redeliver`: to one endpoint, or (without a body) to every endpoint subscribed.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Redeliver {
    /// The endpoint (`we_…`); absent: every enabled endpoint subscribed to the event's type.
    pub endpoint: Option<String>,
    /// Why (at most 500 characters, no control characters but line breaks and tabs): kept in the audit log with
    /// the redelivery.
    #[schema(max_length = 500, pattern = r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$")]
    pub reason: Option<String>,
}

/// A delivery a redelivery made.
#[derive(Debug, Serialize, ToSchema)]
pub struct Redelivery {
    /// `whd_…`.
    pub id: String,
    /// The endpoint.
    pub endpoint: String,
}

/// What a redelivery made.
#[derive(Debug, Serialize, ToSchema)]
pub struct Redelivered {
    /// One per endpoint; the event goes with its own id.
    pub deliveries: Vec<Redelivery>,
}

/// Filters of `GET /v1/events`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogQuery {
    /// The `next_cursor` of a previous page; absent: from the oldest event kept.
    #[param(pattern = r"^(0|[1-9][0-9]{0,17})\.(evt_[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub after: Option<String>,
    /// Page size (1–1000, default 100).
    pub limit: Option<i64>,
    /// Only these types, comma-separated (payment.succeeded, payment.declined, payment.failed,
    /// payment.refunded, refund.succeeded, refund.failed).
    #[param(
        rename = "type",
        pattern = r"^(payment\.(succeeded|declined|failed|refunded)|refund\.(succeeded|failed))(,(payment\.(succeeded|declined|failed|refunded)|refund\.(succeeded|failed)))*$"
    )]
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// An operator key: only this tenant's (a tenant key: its own, the only one it may name).
    #[param(pattern = r"^[^\u0000]*$")]
    pub tenant: Option<String>,
}

/// The tenant whose rows `caller` reads, with `?tenant=` (`named`): a tenant key its own only; an operator (and
/// the zero-configuration mode) the one it names, or every tenant. A NUL byte names no tenant a key can have
/// (and no database stores it): a client's mistake.
pub(crate) fn scope(caller: &Caller, named: Option<String>) -> Result<Option<String>, ApiError> {
    if named.as_deref().is_some_and(|t| t.contains('\0')) {
        return Err(ApiError::invalid("tenant must not contain a NUL byte"));
    }
    match caller {
        Caller::Tenant(own) => match named {
            Some(other) if other != *own => Err(ApiError::forbidden("a tenant key reads its own tenant's only")),
            _ => Ok(Some(own.clone())),
        },
        Caller::Operator(_) | Caller::Local => Ok(named),
    }
}

/// `type=` as types.
fn types(raw: Option<&str>) -> Result<Vec<EventType>, ApiError> {
    raw.map_or(Ok(Vec::new()), |raw| {
        raw.split(',')
            .map(|t| {
                t.parse::<EventType>().map_err(|_| {
                    let all: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
                    ApiError::invalid(format!("type: `{t}` is not one of {}", all.join(", ")))
                })
            })
            .collect()
    })
}

/// The tenant's events in the order they were committed, a page at a time: a cursor taken now and read later
/// misses nothing committed after it, whatever the order of ids. A cursor older than the oldest event kept is
/// `410 cursor_expired`.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(LogQuery),
    responses(
        (status = 200, description = "A page of events, in commit order", body = EventPage),
        (status = 400, description = "invalid_request: a cursor this API did not give, an unknown type, a limit out of range", body = crate::error::Problem),
        (status = 403, description = "forbidden: a tenant key naming another tenant", body = crate::error::Problem),
        (status = 410, description = "cursor_expired: events after the cursor were deleted by retention", body = crate::error::Problem),
    ))]
pub async fn list_events<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    query: Result<Query<LogQuery>, QueryRejection>,
) -> Result<Json<EventPage>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let after = q
        .after
        .as_deref()
        .map(|raw| Position::parse(raw).ok_or_else(|| ApiError::invalid("after is not a next_cursor of this API")))
        .transpose()?;
    let types = types(q.kind.as_deref())?;
    let scope = scope(&caller, q.tenant)?;
    let page = state.payments.events().log(scope.as_deref(), after, &types, limit).await?;
    Ok(Json(EventPage { events: page.events.iter().map(EventBody::from).collect(), next_cursor: page.next.cursor() }))
}

/// One event with its deliveries (another tenant's is `404`, as one that does not exist).
#[utoipa::path(get, path = "/v1/events/{event_id}", tag = "events",
    params(("event_id" = String, Path, description = "The event (evt_…)", pattern = r"^evt_[0-9A-HJKMNP-TV-Z]{26}$")),
    responses(
        (status = 200, description = "The event and its deliveries", body = EventDetail),
        (status = 404, description = "event_not_found", body = crate::error::Problem),
    ))]
pub async fn get_event<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<EventDetail>, ApiError> {
    let (event, deliveries) = state.payments.events().event(caller.tenant_scope(), &id).await?;
    let EventBody { id, kind, created_at, tenant, data } = EventBody::from(&event);
    let deliveries = deliveries.into_iter().map(DeliveryBody::from).collect();
    Ok(Json(EventDetail { id, kind, created_at, tenant, data, deliveries }))
}

/// Sends an event again now, with the same id: to `{"endpoint": "we_…"}`, or (no body) to every enabled
/// endpoint subscribed to its type.
#[utoipa::path(post, path = "/v1/events/{event_id}/redeliver", tag = "events",
    params(("event_id" = String, Path, description = "The event (evt_…)", pattern = r"^evt_[0-9A-HJKMNP-TV-Z]{26}$")),
    request_body(content = Redeliver, description = "Optional: one endpoint, and why (kept in the audit log)", content_type = "application/json"),
    responses(
        (status = 202, description = "Deliveries made, due now", body = Redelivered),
        (status = 400, description = "invalid_request: a body that is not a Redeliver, a reason too long or with control characters", body = crate::error::Problem),
        (status = 403, description = "forbidden: a browser's request for another site's page", body = crate::error::Problem),
        (status = 404, description = "event_not_found, endpoint_not_found", body = crate::error::Problem),
        (status = 409, description = "endpoint_disabled", body = crate::error::Problem),
        (status = 415, description = "unsupported_media_type: not asked for as application/json (even without a body)", body = crate::error::Problem),
    ))]
pub async fn redeliver<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    Path(id): Path<String>,
    ActionJson(asked): ActionJson<Redeliver>,
) -> Result<(StatusCode, Json<Redelivered>), ApiError> {
    let reason = audit::reason(asked.reason)?;
    // What the entry names: the event, whose it is, and the workflow of the payment it tells of. An event the
    // caller may not see is not found, and not recorded.
    let (event, _) = state.payments.events().event(caller.tenant_scope(), &id).await?;
    let workflow_id = event.data().get("workflow_id").and_then(|w| w.as_str()).map(str::to_owned);
    let subject = Subject { workflow_id, other: Some(event.id.clone()), tenant: Some(event.tenant.clone()) };
    let (payments, scope, endpoint) =
        (state.payments.clone(), caller.tenant_scope().map(str::to_owned), asked.endpoint);
    let act = async move {
        let made = payments.events().redeliver(scope.as_deref(), &id, endpoint.as_deref()).await?;
        Ok(made.into_iter().map(|d| Redelivery { id: d.id, endpoint: d.endpoint_id }).collect::<Vec<_>>())
    };
    let said = |made: &Vec<Redelivery>| format!("{} deliveries made", made.len());
    let deliveries = audited(&state, &caller, "redeliver", subject, reason, act, 202, said).await?;
    Ok((StatusCode::ACCEPTED, Json(Redelivered { deliveries })))
}
