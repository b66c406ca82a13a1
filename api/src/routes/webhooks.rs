//! A tenant's webhook endpoints (`contracts/events.md`): register (the secret shown once), list, read, change,
//! delete, rotate the secret, and every attempt made to one. A tenant key manages its own; an operator key reads
//! every tenant's (changes take a tenant's key). Another tenant's endpoint is `404`, as one that does not exist.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::{IntoParams, ToSchema};

use onceflow_payments::PaymentStore;
use onceflow_payments::events::{Attempt, AttemptOutcome, Endpoint, EndpointPatch, EventType, rfc3339};

use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::routes::events::scope;
use crate::state::{AppState, Caller, Tenant};

/// A new endpoint.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// Where events are posted: `https` (plain `http` only with `--webhook-allow-http`), a public address (private,
    /// loopback and link-local ones only with `--webhook-allow-private`).
    #[schema(pattern = "^https?://", max_length = 2048)]
    pub url: String,
    /// The types delivered to it (at least one); absent: every type.
    #[schema(min_items = 1)]
    pub events: Option<Vec<EventType>>,
}

/// A change to an endpoint: each field given is changed.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchEndpoint {
    /// A new URL, checked as at registration.
    #[schema(pattern = "^https?://", max_length = 2048)]
    pub url: Option<String>,
    /// New subscriptions (at least one type); `null`: every type.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<EventType>>, min_items = 1)]
    pub events: Option<Option<Vec<EventType>>>,
    /// `true` enables it again (one a `410` disabled too), `false` disables it.
    pub enabled: Option<bool>,
}

/// A field that is present (`null` included) as `Some`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// An endpoint (without its secret).
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointBody {
    /// `we_…`.
    pub id: String,
    /// Where events are posted.
    pub url: String,
    /// The types delivered to it; `null`: every type.
    #[schema(required = true)]
    pub events: Option<Vec<EventType>>,
    /// Whether events are delivered to it.
    pub enabled: bool,
    /// Why it is disabled: `gone` (it answered `410`) or `disabled` (by its tenant); null while enabled.
    #[schema(required = true)]
    pub disabled_reason: Option<String>,
    /// Created (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// Last changed (RFC 3339).
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<&Endpoint> for EndpointBody {
    fn from(e: &Endpoint) -> Self {
        Self {
            id: e.id.clone(),
            url: e.url.clone(),
            events: e.types(),
            enabled: e.enabled,
            disabled_reason: e.disabled_reason.clone(),
            created_at: rfc3339(e.created_at),
            updated_at: rfc3339(e.updated_at),
        }
    }
}

/// An endpoint with its secret: the answer to its registration and to a rotation, the only times the secret is
/// shown.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointWithSecret {
    /// `we_…`.
    pub id: String,
    /// Where events are posted.
    pub url: String,
    /// The types delivered to it; `null`: every type.
    #[schema(required = true)]
    pub events: Option<Vec<EventType>>,
    /// Whether events are delivered to it.
    pub enabled: bool,
    /// `whsec_<base64>`: verify each delivery's `webhook-signature` with it (Standard Webhooks). Shown once.
    pub secret: String,
    /// Created (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl From<&Endpoint> for EndpointWithSecret {
    fn from(e: &Endpoint) -> Self {
        Self {
            id: e.id.clone(),
            url: e.url.clone(),
            events: e.types(),
            enabled: e.enabled,
            secret: e.secret.clone(),
            created_at: rfc3339(e.created_at),
        }
    }
}

/// The endpoints.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointList {
    /// Oldest first.
    pub endpoints: Vec<EndpointBody>,
}

/// Filters of `GET /v1/webhook-endpoints`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EndpointsQuery {
    /// An operator key: only this tenant's (a tenant key: its own, the only one it may name).
    #[param(pattern = r"^[^\u0000]*$")]
    pub tenant: Option<String>,
}

/// One attempt to deliver an event to an endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptBody {
    /// The delivery (`whd_…`).
    pub delivery: String,
    /// The event (`evt_…`).
    pub event: String,
    /// 1, 2, …
    pub attempt: i32,
    /// in_flight, delivered, failed or abandoned (its process stopped; the delivery was tried again).
    pub outcome: AttemptOutcome,
    /// Started (RFC 3339).
    #[schema(format = DateTime)]
    pub started_at: String,
    /// The endpoint's status code, if it answered.
    #[schema(required = true)]
    pub status_code: Option<i32>,
    /// How long it took (ms).
    #[schema(required = true)]
    pub latency_ms: Option<i64>,
    /// What went wrong.
    #[schema(required = true)]
    pub error: Option<String>,
    /// When the next attempt is due (RFC 3339), if one is.
    #[schema(format = DateTime, required = true)]
    pub next_attempt_at: Option<String>,
}

impl From<Attempt> for AttemptBody {
    fn from(a: Attempt) -> Self {
        Self {
            delivery: a.delivery_id,
            event: a.event_id,
            attempt: a.attempt,
            outcome: a.outcome,
            started_at: rfc3339(a.started_at),
            status_code: a.status_code,
            latency_ms: a.latency_ms,
            error: a.error,
            next_attempt_at: a.next_attempt_at.map(rfc3339),
        }
    }
}

/// A page of attempts.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptPage {
    /// Newest first.
    pub deliveries: Vec<AttemptBody>,
    /// The `cursor` of the next page; null on the last.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// Filters of `GET /v1/webhook-endpoints/{endpoint_id}/deliveries`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AttemptsQuery {
    /// The `next_cursor` of the previous page.
    #[param(pattern = r"^(0|[1-9][0-9]{0,17})\.whd_[0-9A-HJKMNP-TV-Z]{26}\.[1-9][0-9]{0,8}$")]
    pub cursor: Option<String>,
    /// Page size (1–1000, default 100).
    pub limit: Option<i64>,
}

/// `<started_at>.<delivery>.<attempt>`.
fn parse_cursor(raw: &str) -> Option<(i64, String, i32)> {
    let mut parts = raw.split('.');
    let (at, delivery, attempt) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || (at.len() > 1 && at.starts_with('0')) || attempt.starts_with('0') {
        return None;
    }
    let well_formed = delivery.strip_prefix("whd_").is_some_and(|r| {
        r.len() == 26 && r.bytes().all(|b| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b)))
    });
    if !well_formed || !at.bytes().all(|b| b.is_ascii_digit()) || !attempt.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((at.parse().ok()?, delivery.to_owned(), attempt.parse().ok()?))
}

/// Whether a list of subscriptions is usable: at least one type.
fn some_types(events: Option<&Vec<EventType>>) -> Result<(), ApiError> {
    match events {
        Some(types) if types.is_empty() => {
            Err(ApiError::invalid("events: name at least one type, or leave it out for every type"))
        }
        _ => Ok(()),
    }
}

/// Registers an endpoint of the caller's tenant. The answer shows its secret, this once.
#[utoipa::path(post, path = "/v1/webhook-endpoints", request_body = CreateEndpoint, tag = "webhooks",
    responses(
        (status = 201, description = "Registered; the secret is shown this once", body = EndpointWithSecret),
        (status = 403, description = "forbidden: an operator key (endpoints are a tenant's)", body = crate::error::Problem),
        (status = 422, description = "webhook_url_refused (the detail names the rule), endpoint_limit", body = crate::error::Problem),
    ))]
pub async fn create_endpoint<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    ApiJson(body): ApiJson<CreateEndpoint>,
) -> Result<(StatusCode, Json<EndpointWithSecret>), ApiError> {
    some_types(body.events.as_ref())?;
    let endpoint = state.payments.events().create_endpoint(&tenant, &body.url, body.events).await?;
    Ok((StatusCode::CREATED, Json(EndpointWithSecret::from(&endpoint))))
}

/// The endpoints the caller sees, oldest first.
#[utoipa::path(get, path = "/v1/webhook-endpoints", tag = "webhooks", params(EndpointsQuery),
    responses(
        (status = 200, description = "The endpoints", body = EndpointList),
        (status = 403, description = "forbidden: a tenant key naming another tenant", body = crate::error::Problem),
    ))]
pub async fn list_endpoints<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    query: Result<Query<EndpointsQuery>, QueryRejection>,
) -> Result<Json<EndpointList>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let scope = scope(&caller, q.tenant)?;
    let endpoints = state.payments.events().endpoints(scope.as_deref()).await?;
    Ok(Json(EndpointList { endpoints: endpoints.iter().map(EndpointBody::from).collect() }))
}

/// One endpoint.
#[utoipa::path(get, path = "/v1/webhook-endpoints/{endpoint_id}", tag = "webhooks",
    params(("endpoint_id" = String, Path, description = "The endpoint (we_…)", pattern = r"^we_[0-9A-HJKMNP-TV-Z]{26}$")),
    responses(
        (status = 200, description = "The endpoint", body = EndpointBody),
        (status = 404, description = "endpoint_not_found", body = crate::error::Problem),
    ))]
pub async fn get_endpoint<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<EndpointBody>, ApiError> {
    let endpoint = state.payments.events().endpoint(caller.tenant_scope(), &id).await?;
    Ok(Json(EndpointBody::from(&endpoint)))
}

/// Changes an endpoint: its URL (checked as at registration), its subscriptions, whether it is enabled.
#[utoipa::path(patch, path = "/v1/webhook-endpoints/{endpoint_id}", request_body = PatchEndpoint, tag = "webhooks",
    params(("endpoint_id" = String, Path, description = "The endpoint (we_…)", pattern = r"^we_[0-9A-HJKMNP-TV-Z]{26}$")),
    responses(
        (status = 200, description = "Changed", body = EndpointBody),
        (status = 403, description = "forbidden: an operator key", body = crate::error::Problem),
        (status = 404, description = "endpoint_not_found", body = crate::error::Problem),
        (status = 422, description = "webhook_url_refused (the detail names the rule)", body = crate::error::Problem),
    ))]
pub async fn update_endpoint<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<PatchEndpoint>,
) -> Result<Json<EndpointBody>, ApiError> {
    if let Some(events) = &body.events {
        some_types(events.as_ref())?;
    }
    let patch = EndpointPatch { url: body.url, events: body.events, enabled: body.enabled };
    let endpoint = state.payments.events().update_endpoint(Some(&tenant), &id, patch).await?;
    Ok(Json(EndpointBody::from(&endpoint)))
}

/// Deletes an endpoint; its pending deliveries fail.
#[utoipa::path(delete, path = "/v1/webhook-endpoints/{endpoint_id}", tag = "webhooks",
    params(("endpoint_id" = String, Path, description = "The endpoint (we_…)", pattern = r"^we_[0-9A-HJKMNP-TV-Z]{26}$")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "forbidden: an operator key", body = crate::error::Problem),
        (status = 404, description = "endpoint_not_found", body = crate::error::Problem),
    ))]
pub async fn delete_endpoint<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.payments.events().delete_endpoint(Some(&tenant), &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Gives an endpoint a new secret, shown this once; the old one keeps signing beside it for 24 h (each delivery
/// then carries both signatures).
#[utoipa::path(post, path = "/v1/webhook-endpoints/{endpoint_id}/rotate-secret", tag = "webhooks",
    params(("endpoint_id" = String, Path, description = "The endpoint (we_…)", pattern = r"^we_[0-9A-HJKMNP-TV-Z]{26}$")),
    responses(
        (status = 200, description = "The endpoint with its new secret", body = EndpointWithSecret),
        (status = 403, description = "forbidden: an operator key", body = crate::error::Problem),
        (status = 404, description = "endpoint_not_found", body = crate::error::Problem),
    ))]
pub async fn rotate_secret<S: PaymentStore>(
    State(state): State<AppState<S>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<EndpointWithSecret>, ApiError> {
    let endpoint = state.payments.events().rotate_secret(Some(&tenant), &id).await?;
    Ok(Json(EndpointWithSecret::from(&endpoint)))
}

/// Every attempt made to an endpoint (time, status code, latency, error, next attempt), newest first.
#[utoipa::path(get, path = "/v1/webhook-endpoints/{endpoint_id}/deliveries", tag = "webhooks",
    params(("endpoint_id" = String, Path, description = "The endpoint (we_…)", pattern = r"^we_[0-9A-HJKMNP-TV-Z]{26}$"), AttemptsQuery),
    responses(
        (status = 200, description = "A page of attempts, newest first", body = AttemptPage),
        (status = 400, description = "invalid_request: a cursor this API did not give, a limit out of range", body = crate::error::Problem),
        (status = 404, description = "endpoint_not_found", body = crate::error::Problem),
    ))]
pub async fn list_attempts<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<AttemptsQuery>, QueryRejection>,
) -> Result<Json<AttemptPage>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let before = q
        .cursor
        .as_deref()
        .map(|raw| parse_cursor(raw).ok_or_else(|| ApiError::invalid("cursor is not a next_cursor of this API")))
        .transpose()?;
    let mut attempts = state.payments.events().attempts(caller.tenant_scope(), &id, before.as_ref(), limit + 1).await?;
    let more = attempts.len() as i64 > limit;
    attempts.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next_cursor =
        attempts.last().filter(|_| more).map(|a| format!("{}.{}.{}", a.started_at, a.delivery_id, a.attempt));
    Ok(Json(AttemptPage { deliveries: attempts.into_iter().map(AttemptBody::from).collect(), next_cursor }))
}
