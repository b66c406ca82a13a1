//! `GET /v1/unresolved`: the payments whose charge outcome is still unknown or `processing`, and the refunds
//! likewise, oldest first, each with its age (contracts/console.md, Attention): a tenant key's own, an
//! operator's of every tenant (or `tenant=`'s). Read through the indexes of unresolved payments and refunds, so
//! neither table is scanned.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use onceflow_payments::{PaymentBody, PaymentStore, RefundBody};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;
use crate::routes::orders::rfc3339;
use crate::state::{AppState, Caller};

/// Most unresolved payments read for one answer (a tenant's are picked from them).
const READ: i64 = 1000;

/// The query of `GET /v1/unresolved`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UnresolvedQuery {
    /// Operators: only this tenant's.
    #[param(pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub tenant: Option<String>,
    /// How many to list, oldest first (1–1000, default 50).
    pub limit: Option<i64>,
}

/// An unresolved payment and how long it has been so.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnresolvedPayment {
    /// Seconds since it was created.
    pub age_seconds: i64,
    /// When it was created (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The payment, with its `workflow_id`.
    pub payment: PaymentBody,
    /// Whose it is.
    pub tenant: String,
}

/// An unresolved refund and how long it has been so.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnresolvedRefund {
    /// Seconds since it was created.
    pub age_seconds: i64,
    /// The refund, with its `request_no` and `workflow_id`.
    pub refund: RefundBody,
    /// Whose it is.
    pub tenant: String,
}

/// The unresolved payments and refunds (`GET /v1/unresolved`).
#[derive(Debug, Serialize, ToSchema)]
pub struct Unresolved {
    /// How many there are (of the caller's tenants; a tenant's count stops at 1000).
    pub count: i64,
    /// The oldest one's age in seconds; absent when there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_age_seconds: Option<i64>,
    /// The oldest `limit` of them, oldest first.
    pub payments: Vec<UnresolvedPayment>,
    /// How many refunds are unresolved (asked of the channel, the outcome unknown or processing; of the
    /// caller's tenants; a tenant's count stops at 1000).
    pub refund_count: i64,
    /// The oldest `limit` of them, oldest first.
    pub refunds: Vec<UnresolvedRefund>,
}

/// Payments whose charge outcome is still unknown or `processing`, and refunds likewise, oldest first, with their
/// ages: what an operator looks at first. They are retried, never failed on their own.
#[utoipa::path(get, path = "/v1/unresolved", tag = "operations", params(UnresolvedQuery),
    responses(
        (status = 200, description = "The unresolved payments and refunds, oldest first", body = Unresolved),
        (status = 400, description = "invalid_request: a limit out of range, a control character in tenant", body = crate::error::Problem),
    ))]
pub async fn unresolved<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    query: Result<Query<UnresolvedQuery>, QueryRejection>,
) -> Result<Json<Unresolved>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let store = state.payments.engine().store();
    let now = chrono::Utc::now().timestamp_millis();
    let map = |e: sqlx::Error| ApiError::from(onceflow_payments::Error::from(e));
    let named = crate::text::plain_opt("tenant", q.tenant.as_deref())?;
    let tenant = caller.tenant_scope().or(named).map(str::to_owned);
    // A tenant's own, read as such (through the partial index of unresolved payments, which holds only them):
    // not picked from every tenant's oldest, which another tenant's could fill.
    let mine = store.unresolved_before(tenant.as_deref(), now, READ).await.map_err(map)?;
    let count = match &tenant {
        Some(_) => mine.len() as i64,
        None => store.unresolved().await.map_err(map)?.0,
    };
    let age = |created_at: i64| ((now - created_at) / 1000).max(0);
    let oldest_age_seconds = mine.first().map(|(_, _, created_at)| age(*created_at));
    let mut payments = Vec::new();
    for (tenant, request_no, created_at) in mine.into_iter().take(usize::try_from(limit).unwrap_or(50)) {
        // Resolved since it was listed: no longer one to show.
        if let Some(p) = state.payments.payment(&tenant, &request_no).await? {
            let payment = p.view();
            payments.push(UnresolvedPayment {
                age_seconds: age(created_at),
                created_at: rfc3339(created_at),
                payment,
                tenant,
            });
        }
    }
    let refunds = store.unresolved_refunds_before(tenant.as_deref(), now, READ).await.map_err(map)?;
    let refund_count = match tenant {
        Some(_) => refunds.len() as i64,
        None => store.unresolved_refunds().await.map_err(map)?.0,
    };
    let refunds = refunds
        .into_iter()
        .take(usize::try_from(limit).unwrap_or(50))
        .map(|r| UnresolvedRefund { age_seconds: age(r.created_at), refund: r.view(), tenant: r.tenant })
        .collect();
    Ok(Json(Unresolved { count, oldest_age_seconds, payments, refund_count, refunds }))
}
