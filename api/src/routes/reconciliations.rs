//! `GET /v1/reconciliations`: what reconciling a day's channel statement found, per tenant (operators only).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use onceflow_payments::{PaymentStore, Reconciliation, reconciliations};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::state::{AppState, Caller};

/// `?date=YYYY-MM-DD[&tenant=T]`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReconciliationQuery {
    /// The UTC day, `YYYY-MM-DD`.
    pub date: String,
    /// Only this tenant's.
    pub tenant: Option<String>,
}

/// The reconciliations of a day.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReconciliationList {
    /// One per tenant reconciled that day.
    pub reconciliations: Vec<Reconciliation>,
}

/// A day's reconciliations: per tenant, its state, counts per class (zeros included) and exceptions.
#[utoipa::path(get, path = "/v1/reconciliations", tag = "operations", params(ReconciliationQuery),
    responses(
        (status = 200, description = "The day's reconciliations", body = ReconciliationList),
        (status = 403, description = "forbidden: a tenant key (reconciliations are for operators)", body = crate::error::Problem),
        (status = 404, description = "reconciliation_not_found: the day is not reconciled yet", body = crate::error::Problem),
    ))]
pub async fn list<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    query: Result<Query<ReconciliationQuery>, QueryRejection>,
) -> Result<Json<ReconciliationList>, ApiError> {
    if !caller.is_operator() {
        return Err(ApiError::forbidden("reconciliations are for operator keys"));
    }
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let day = chrono::NaiveDate::parse_from_str(&q.date, "%Y-%m-%d")
        .map_err(|_| ApiError::invalid("date must be a day written YYYY-MM-DD"))?;
    let day = day.format("%Y-%m-%d").to_string();
    let found = reconciliations(state.payments.engine().store(), &day, q.tenant.as_deref())
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    if found.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "reconciliation_not_found",
            "Not found",
            format!("{day} is not reconciled yet"),
        ));
    }
    Ok(Json(ReconciliationList { reconciliations: found }))
}
