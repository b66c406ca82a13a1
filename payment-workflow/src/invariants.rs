//! The invariants a payment system must keep, checked against the channel's ledger and the database.

use std::collections::HashMap;

use onceflow_engine::store::{Cursor, WorkflowFilter, WorkflowRecord, WorkflowState};

use crate::channel::Ledger;
use crate::model::{Order, OrderStatus, PaymentInput, PaymentRecord, PaymentStatus, TokenState};
use crate::payments::PaymentSaga;
use crate::store::PaymentStore;

/// One broken invariant, said plainly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

/// Checks, per tenant (the channel's merchant): every order has at most one kept (succeeded, not refunded)
/// charge; an order is `paid` exactly when it has one; every kept charge has this tenant's `succeeded` payment
/// record of the same order and amount; every refunded charge was this tenant's own payment's; no order is
/// left `paying` and no payment `processing` (call after recovery has run); and no payment is left in a state
/// with no way out: every `compensation_failed` payment has an operator action that ends it consistently
/// (see [`no_way_out`]).
pub async fn check_invariants<S: PaymentStore>(store: &S, ledger: &Ledger) -> Result<Vec<Violation>, sqlx::Error> {
    let mut violations = Vec::new();
    let orders = store.all_orders().await?;
    let payments: HashMap<(String, String), _> =
        store.all_payments().await?.into_iter().map(|p| ((p.tenant.clone(), p.request_no.to_string()), p)).collect();
    for order in &orders {
        let (tenant, order_no) = (&order.tenant, &order.order_no);
        let kept = ledger.kept_charges_of(tenant, order_no.as_str());
        if kept > 1 {
            violations.push(Violation(format!("order {tenant}/{order_no} was charged {kept} times")));
        }
        let paid = order.status == OrderStatus::Paid;
        if paid != (kept == 1) {
            violations
                .push(Violation(format!("order {tenant}/{order_no} is {} with {kept} kept charges", order.status)));
        }
        if order.status == OrderStatus::Paying {
            violations.push(Violation(format!("order {tenant}/{order_no} is left paying")));
        }
    }
    for charge in &ledger.charges {
        let key = (charge.merchant_id.clone(), charge.merchant_request_no.clone());
        let name = format!("{}/{}", charge.merchant_id, charge.merchant_request_no);
        let record = payments.get(&key);
        if charge.refunded && record.is_none_or(|p| p.order_no != charge.order_no.as_str() || p.amount != charge.amount)
        {
            violations.push(Violation(format!("charge {name} was refunded but is no payment of this tenant's")));
        }
        if !charge.is_kept() {
            continue;
        }
        match record {
            Some(p) if p.status == PaymentStatus::Succeeded && p.order_no == charge.order_no.as_str() => {}
            Some(p) => violations
                .push(Violation(format!("charge {name} succeeded but its payment is {} ({})", p.status, p.order_no))),
            None => violations.push(Violation(format!("charge {name} has no payment record"))),
        }
    }
    for p in payments.values().filter(|p| p.status == PaymentStatus::Processing) {
        violations.push(Violation(format!("payment {}/{} is left processing", p.tenant, p.request_no)));
    }
    let orders: HashMap<(String, String), &Order> =
        orders.iter().map(|o| ((o.tenant.clone(), o.order_no.to_string()), o)).collect();
    for workflow in compensation_failed(store).await? {
        if let Some(why) = no_way_out(store, &workflow, &orders, &payments, ledger).await? {
            let id = &workflow.workflow_id;
            violations.push(Violation(format!("workflow {id} is compensation_failed with no way out: {why}")));
        }
    }
    Ok(violations)
}

/// Every payment workflow in `compensation_failed`, page by page.
async fn compensation_failed<S: PaymentStore>(store: &S) -> Result<Vec<WorkflowRecord>, sqlx::Error> {
    let mut all = Vec::new();
    let mut after: Option<Cursor> = None;
    loop {
        let filter =
            WorkflowFilter { state: Some(WorkflowState::CompensationFailed), after: after.as_ref(), tenant: None };
        let page = store.list(filter, 500).await.map_err(engine_error)?;
        let Some(last) = page.last() else { break };
        after = Some(Cursor::after(last));
        let more = page.len() == 500;
        all.extend(page.into_iter().filter(|w| w.name == <PaymentSaga as onceflow_engine::Workflow<S>>::NAME));
        if !more {
            break;
        }
    }
    Ok(all)
}

fn engine_error(e: onceflow_engine::Error) -> sqlx::Error {
    match e {
        onceflow_engine::Error::Database(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

/// Why a `compensation_failed` payment has no operator action that ends it consistently, if it has none.
///
/// The way out of every `compensation_failed` payment is the operator's retry, which runs its compensations
/// again under the code of today: the charge's number closed or its refund asked again, and then either the
/// money comes back (the order released, the record failed, the token answered) or the channel definitively
/// keeps it and the payment rolls forward (kept, paid, succeeded, answered `201`). Both ends hold only while
/// the payment rests as its failed compensation left it — its record `processing`, its order `paying` under
/// its own reservation, its token `in_use` — so that is what is checked; and a refund the channel failed or
/// refused never ends `compensation_failed` any more (it rolls forward), so one that did, with the charge kept,
/// is a dead end of its own.
async fn no_way_out<S: PaymentStore>(
    store: &S,
    workflow: &WorkflowRecord,
    orders: &HashMap<(String, String), &Order>,
    payments: &HashMap<(String, String), PaymentRecord>,
    ledger: &Ledger,
) -> Result<Option<String>, sqlx::Error> {
    let Ok(input) = serde_json::from_str::<PaymentInput>(&workflow.input) else {
        return Ok(Some("its input does not read as a payment's".into()));
    };
    let (tenant, request_no) = (input.tenant.clone(), input.request_no.to_string());
    let failed_code = serde_json::from_str::<serde_json::Value>(workflow.error.as_deref().unwrap_or("null"))
        .ok()
        .and_then(|e| e.pointer("/details/compensation/failure/code").and_then(|c| c.as_str()).map(str::to_owned));
    let kept =
        ledger.charges.iter().any(|c| c.merchant_id == tenant && c.merchant_request_no == request_no && c.is_kept());
    if kept && matches!(failed_code.as_deref(), Some("refund_failed" | "refund_refused")) {
        return Ok(Some(format!("the channel would not refund {request_no}, and its charge is kept")));
    }
    match payments.get(&(tenant.clone(), request_no.clone())) {
        Some(p) if p.status == PaymentStatus::Processing && p.token == input.token => {}
        Some(p) => return Ok(Some(format!("its record {request_no} is {} (undone in part)", p.status))),
        None => return Ok(Some(format!("it has no record {request_no}"))),
    }
    match orders.get(&(tenant.clone(), input.order_no.to_string())) {
        Some(o) if o.status == OrderStatus::Paying && o.reserved_by.as_deref() == Some(request_no.as_str()) => {}
        Some(o) => return Ok(Some(format!("its order {} is {}, not paying under it", o.order_no, o.status))),
        None => return Ok(Some(format!("its order {} does not exist", input.order_no))),
    }
    let token = store.token_and_order(&input.token, &tenant, &input.order_no).await?.map(|(t, _)| t.state);
    if token != Some(TokenState::InUse) {
        return Ok(Some(format!("its token is {token:?}, not in use")));
    }
    Ok(None)
}
