//! `GET /v1/search?q=`: whatever an operator is asked about — an order number, a payment's number, a token, a
//! channel charge id, a workflow id — to the payments it names (contracts/console.md, Find). A tenant key finds
//! its own tenant's only; an operator every configured tenant's (or `tenant=`'s).
//!
//! Each kind of number is looked up where an index holds it: a payment by its number, an order's payments, a
//! refund by its number (its payment found), a token's workflow by its derived id, an event by its id (the
//! payment it tells of), and a charge id through `payments_charge` (migration 0058) — for an operator in one
//! look across every tenant, stored or configured. Numbers that are unique per tenant only (order, request and
//! refund numbers) are looked up in each tenant an operator's keys name (or `tenant=`), through their indexes
//! led by the tenant.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use onceflow_payments::{OrderNo, PaymentBody, PaymentInput, PaymentRecord, PaymentStore, RefundNo, RequestNo, Token};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;
use crate::routes::orders::{OrderBody, rfc3339};
use crate::state::{AppState, Caller, DEFAULT_TENANT};
use crate::text::{plain, plain_opt};

/// Most matches one search returns.
const MAX_MATCHES: usize = 50;

/// The query of `GET /v1/search`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// An order_no, request_no, refund_no, token, charge_id, workflow_id or event id (1–256 characters).
    #[param(min_length = 1, max_length = 256, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    #[param(required = true)]
    pub q: Option<String>,
    /// Operators: look in this tenant only.
    #[param(pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub tenant: Option<String>,
}

/// One thing a search found.
#[derive(Debug, Serialize, ToSchema)]
pub struct SearchMatch {
    /// What the query matched: order_no, request_no, refund_no, charge_id, token, workflow_id or event_id.
    pub matched: String,
    /// What was found: a `payment`, an `order` without payments, or a `workflow` of another type.
    pub kind: String,
    /// Whose it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The order (of a payment or an order match).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<OrderBody>,
    /// The payment, as `GET /v1/payments/{request_no}` shows it (with its `workflow_id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment: Option<PaymentBody>,
    /// When the payment was created (RFC 3339).
    #[schema(format = DateTime)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// The workflow (of a workflow match; a payment's is in `payment`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
}

/// What a search found.
#[derive(Debug, Serialize, ToSchema)]
pub struct SearchResult {
    /// Every match (at most 50), payments newest first within a kind of match.
    pub matches: Vec<SearchMatch>,
}

/// Finds the payments (or orders, or workflows) an identifier names, among the caller's tenants.
#[utoipa::path(get, path = "/v1/search", tag = "operations", params(SearchQuery),
    responses(
        (status = 200, description = "What the query names (none: an empty list)", body = SearchResult),
        (status = 400, description = "invalid_request: q missing, empty, longer than 256 characters, or with a control character", body = crate::error::Problem),
    ))]
pub async fn search<S: PaymentStore>(
    State(state): State<AppState<S>>,
    caller: Caller,
    query: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Json<SearchResult>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let q = query.q.unwrap_or_default();
    let q = q.as_str();
    if q.is_empty() || q.chars().count() > 256 {
        return Err(ApiError::invalid("q must be 1-256 characters"));
    }
    plain("q", q)?;
    let wanted = plain_opt("tenant", query.tenant.as_deref())?.map(str::to_owned);
    let tenants = match (&caller, &wanted) {
        (Caller::Tenant(own), _) => vec![own.clone()],
        (Caller::Local, _) => vec![DEFAULT_TENANT.to_owned()],
        (Caller::Operator(_), Some(tenant)) => vec![tenant.clone()],
        (Caller::Operator(_), None) => state.auth.tenants(),
    };
    let mut found = Finds::default();
    let store = state.payments.engine().store();
    for tenant in &tenants {
        if let Ok(number) = RequestNo::parse(q)
            && let Some(p) = state.payments.payment(tenant, &number).await?
        {
            found.payment(&state, "request_no", p).await?;
        }
        if let Ok(order_no) = OrderNo::parse(q) {
            // The newest, one page: an order keeps every refused attempt as a record, so reading them all would
            // let a tenant make this read as long as it likes.
            let page = i64::try_from(MAX_MATCHES).unwrap_or(i64::MAX);
            let payments = state.payments.payments_of_order_page(tenant, &order_no, None, page).await?;
            if payments.is_empty()
                && let Some(order) = state.payments.order(tenant, &order_no).await?
            {
                found.push(SearchMatch {
                    matched: "order_no".into(),
                    kind: "order".into(),
                    tenant: Some(tenant.clone()),
                    order: Some(order.into()),
                    payment: None,
                    created_at: None,
                    workflow_id: None,
                });
            }
            for p in payments {
                found.payment(&state, "order_no", p).await?;
            }
        }
        // A refund's number names its payment.
        if let Ok(refund_no) = RefundNo::parse(q)
            && let Some(r) = state.payments.refund_record(tenant, &refund_no).await?
            && let Some(p) = state.payments.payment(tenant, &r.request_no).await?
        {
            found.payment(&state, "refund_no", p).await?;
        }
    }
    // A charge id through its index, in one look: an operator's (without `tenant=`) across every tenant.
    let charge_scope = match (&caller, &wanted) {
        (Caller::Tenant(own), _) => Some(own.as_str()),
        (Caller::Local, _) => Some(DEFAULT_TENANT),
        (Caller::Operator(_), wanted) => wanted.as_deref(),
    };
    let by_charge = store.payments_by_charge(charge_scope, q, MAX_MATCHES as i64).await;
    for p in by_charge.map_err(onceflow_payments::Error::from)? {
        found.payment(&state, "charge_id", p).await?;
    }
    // An event's id names the payment it tells of (a tenant sees its own events only).
    if q.starts_with("evt_")
        && let Ok((event, _)) = state.payments.events().event(caller.tenant_scope(), q).await
        && wanted.as_ref().is_none_or(|t| *t == event.tenant)
        && let Some(number) = event.data().get("request_no").and_then(|n| n.as_str()).map(str::to_owned)
        && let Ok(request_no) = RequestNo::parse(&number)
        && let Some(p) = state.payments.payment(&event.tenant, &request_no).await?
    {
        found.payment(&state, "event_id", p).await?;
    }
    // A token names its payment's workflow; a workflow id names itself.
    let mut ids = vec![(q.to_owned(), "workflow_id")];
    if let Ok(token) = Token::parse(q) {
        ids.push((onceflow_payments::payment_workflow_id(&token), "token"));
    }
    for (id, matched) in ids {
        let Some(record) = store.workflow(&id).await? else { continue };
        let input: Option<PaymentInput> =
            if record.name == "payment" { serde_json::from_str(&record.input).ok() } else { None };
        let tenant = record.tenant.clone().or_else(|| input.as_ref().map(|i| i.tenant.clone()));
        // A tenant finds its own workflows only; an operator any (of `tenant=` when given).
        let visible = match (caller.tenant_scope(), &wanted) {
            (Some(own), _) => tenant.as_deref() == Some(own),
            (None, Some(wanted)) => tenant.as_ref() == Some(wanted),
            (None, None) => true,
        };
        if !visible {
            continue;
        }
        match input {
            Some(i) => {
                if let Some(p) = state.payments.payment(&i.tenant, &i.request_no).await? {
                    found.payment(&state, matched, p).await?;
                }
            }
            None => found.push(SearchMatch {
                matched: matched.into(),
                kind: "workflow".into(),
                tenant,
                order: None,
                payment: None,
                created_at: None,
                workflow_id: Some(record.workflow_id),
            }),
        }
    }
    Ok(Json(SearchResult { matches: found.matches }))
}

/// The matches so far, each payment once.
#[derive(Default)]
struct Finds {
    matches: Vec<SearchMatch>,
    seen: std::collections::HashSet<(String, String)>,
}

impl Finds {
    fn push(&mut self, m: SearchMatch) {
        if self.matches.len() < MAX_MATCHES {
            self.matches.push(m);
        }
    }

    async fn payment<S: PaymentStore>(
        &mut self,
        state: &AppState<S>,
        matched: &str,
        p: PaymentRecord,
    ) -> Result<(), ApiError> {
        if !self.seen.insert((p.tenant.clone(), p.request_no.to_string())) {
            return Ok(());
        }
        let order = state.payments.order(&p.tenant, &p.order_no).await?.map(OrderBody::from);
        self.push(SearchMatch {
            matched: matched.into(),
            kind: "payment".into(),
            tenant: Some(p.tenant.clone()),
            order,
            created_at: Some(rfc3339(p.created_at)),
            payment: Some(p.view()),
            workflow_id: None,
        });
        Ok(())
    }
}
