//! The invariants a payment system must keep, checked against the channel's ledger and the database.

use std::collections::{HashMap, HashSet};

use onceflow_engine::store::{Cursor, WorkflowFilter, WorkflowRecord, WorkflowState};

use crate::channel::{ChargeStatus, Ledger, RefundStatus};
use crate::model::{
    Order, OrderStatus, PaymentInput, PaymentRecord, PaymentStatus, RefundRecord, RefundState, TokenState,
    merchant_refund_no, refund_no_of,
};
use crate::payments::PaymentSaga;
use crate::store::PaymentStore;

/// One broken invariant, said plainly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

/// A tenant (the channel's merchant) and one of its numbers.
type Key = (String, String);

/// Checks, per tenant (the channel's merchant): every order has at most one kept (succeeded, not refunded in
/// full) charge; an order is `paid` exactly when it has one, and `refunded` exactly when the charge of its
/// `succeeded` payment came back whole through the merchant's refunds; every kept charge has this tenant's
/// `succeeded` payment record of the same order and amount; every refunded charge was this tenant's own
/// payment's, and its refunds never exceed it; per charge, the channel's succeeded merchant refunds sum to the
/// payment's `refunded_amount`; every refund at the channel is a refund of ours (a merchant's, under the number
/// derived from its `refund_no`, of the same payment and amount, or a compensation's, of its own payment) and
/// every one of ours is at the channel as it says; no channel number is used by two refunds; nothing is left
/// `paying`, `processing` or reserved (call after recovery has run); and no payment is left in a state with no
/// way out: every `compensation_failed` payment has an operator action that ends it consistently (see
/// [`no_way_out`]).
pub async fn check_invariants<S: PaymentStore>(store: &S, ledger: &Ledger) -> Result<Vec<Violation>, sqlx::Error> {
    let mut violations = Vec::new();
    let payments: HashMap<Key, PaymentRecord> =
        store.all_payments().await?.into_iter().map(|p| ((p.tenant.clone(), p.request_no.to_string()), p)).collect();
    let refunds = store.all_refunds().await?;
    check_orders(store, ledger, &payments, &mut violations).await?;
    check_charges(ledger, &payments, &mut violations);
    check_refunds(ledger, &payments, &refunds, &mut violations);
    for p in payments.values() {
        let name = format!("payment {}/{}", p.tenant, p.request_no);
        if p.status == PaymentStatus::Processing {
            violations.push(Violation(format!("{name} is left processing")));
        }
        if p.refund_reserved != 0 {
            violations.push(Violation(format!("{name} has {} reserved for refunds, left so", p.refund_reserved)));
        }
        if p.refunded_amount + p.refund_reserved > p.amount || p.refunded_amount < 0 {
            violations.push(Violation(format!("{name} refunded {} of {}", p.refunded_amount, p.amount)));
        }
    }
    let orders = store.all_orders().await?;
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

/// What the refunds a payment records gave back of each charge, by its number: the merchant's succeeded refunds,
/// and a compensation's that gave back only part of a charge that was then kept (its payment rolled forward,
/// `succeeded`, the part recorded as refunded).
fn recorded_refunds(ledger: &Ledger, payments: &HashMap<Key, PaymentRecord>) -> HashMap<Key, i64> {
    let mut refunded = HashMap::new();
    for r in ledger.refunds.iter().filter(|r| r.status == RefundStatus::Succeeded) {
        let key = (r.merchant_id.clone().unwrap_or_default(), r.merchant_request_no.clone());
        if refund_no_of(&r.merchant_refund_no).is_some() || kept_part(r, payments.get(&key)) {
            *refunded.entry(key).or_default() += r.amount;
        }
    }
    refunded
}

/// Whether `r`, a compensation's refund, gave back only part of its payment `p`'s charge, the rest kept.
fn kept_part(r: &crate::channel::Refund, p: Option<&PaymentRecord>) -> bool {
    refund_no_of(&r.merchant_refund_no).is_none()
        && r.status == RefundStatus::Succeeded
        && p.is_some_and(|p| {
            p.request_no.refund_no() == r.merchant_refund_no
                && p.status == PaymentStatus::Succeeded
                && r.amount < p.amount
        })
}

async fn check_orders<S: PaymentStore>(
    store: &S,
    ledger: &Ledger,
    payments: &HashMap<Key, PaymentRecord>,
    violations: &mut Vec<Violation>,
) -> Result<(), sqlx::Error> {
    let refunded = recorded_refunds(ledger, payments);
    for order in &store.all_orders().await? {
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
        // Given back whole by the merchant's refunds: a succeeded charge of the order, of a succeeded payment.
        let given_back = ledger.charges.iter().any(|c| {
            let key = (c.merchant_id.clone(), c.merchant_request_no.clone());
            c.merchant_id == *tenant
                && c.order_no == order_no.as_str()
                && c.status == ChargeStatus::Succeeded
                && payments.get(&key).is_some_and(|p| p.status == PaymentStatus::Succeeded)
                && refunded.get(&key).copied().unwrap_or(0) == c.amount
        });
        if (order.status == OrderStatus::Refunded) != given_back {
            let came_back = if given_back { "came back whole" } else { "did not come back whole" };
            violations
                .push(Violation(format!("order {tenant}/{order_no} is {} but its charge {came_back}", order.status)));
        }
    }
    Ok(())
}

fn check_charges(ledger: &Ledger, payments: &HashMap<Key, PaymentRecord>, violations: &mut Vec<Violation>) {
    let refunded = recorded_refunds(ledger, payments);
    for charge in &ledger.charges {
        let key = (charge.merchant_id.clone(), charge.merchant_request_no.clone());
        let name = format!("{}/{}", charge.merchant_id, charge.merchant_request_no);
        let record = payments.get(&key);
        if charge.refunded && record.is_none_or(|p| p.order_no != charge.order_no.as_str() || p.amount != charge.amount)
        {
            violations.push(Violation(format!("charge {name} was refunded but is no payment of this tenant's")));
        }
        if charge.refunded_amount > charge.amount {
            violations
                .push(Violation(format!("charge {name} of {} was refunded {}", charge.amount, charge.refunded_amount)));
        }
        let by_merchant = refunded.get(&key).copied().unwrap_or(0);
        if let Some(p) = record
            && p.refunded_amount != by_merchant
        {
            violations.push(Violation(format!(
                "charge {name}: the channel's merchant refunds gave back {by_merchant}, the payment says {}",
                p.refunded_amount
            )));
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
}

fn check_refunds(
    ledger: &Ledger,
    payments: &HashMap<Key, PaymentRecord>,
    refunds: &[RefundRecord],
    violations: &mut Vec<Violation>,
) {
    let ours: HashMap<Key, &RefundRecord> =
        refunds.iter().map(|r| ((r.tenant.clone(), r.merchant_refund_no.clone()), r)).collect();
    if ours.len() != refunds.len() {
        violations.push(Violation("two refunds share a channel number".into()));
    }
    let mut at_channel: HashMap<Key, RefundStatus> = HashMap::new();
    let mut by_payment: HashMap<Key, (i64, i64)> = HashMap::new();
    for r in &ledger.refunds {
        let merchant = r.merchant_id.clone().unwrap_or_default();
        let name = format!("{merchant}/{}", r.merchant_refund_no);
        if at_channel.insert((merchant.clone(), r.merchant_refund_no.clone()), r.status).is_some() {
            violations.push(Violation(format!("refund number {name} was used twice at the channel")));
        }
        if refund_no_of(&r.merchant_refund_no).is_none() {
            // A compensation's: the payment's own number, refunded whole (or, kept, in part).
            let payment = payments.get(&(merchant.clone(), r.merchant_request_no.clone()));
            let own = payment.is_some_and(|p| p.request_no.refund_no() == r.merchant_refund_no && p.amount == r.amount)
                || kept_part(r, payment);
            if kept_part(r, payment) {
                let entry = by_payment.entry((merchant.clone(), r.merchant_request_no.clone())).or_default();
                entry.0 += r.amount;
            }
            if !own {
                violations.push(Violation(format!("refund {name} is neither a merchant's nor a compensation's")));
            }
            continue;
        }
        match ours.get(&(merchant, r.merchant_refund_no.clone())) {
            None => violations.push(Violation(format!("refund {name} at the channel has no refund record"))),
            Some(o) if o.request_no.as_str() != r.merchant_request_no || o.amount != r.amount => {
                violations.push(Violation(format!("refund {name} refunded another payment or amount than ours")));
            }
            Some(o) => {
                let agree = matches!(
                    (o.status, r.status),
                    (RefundState::Succeeded, RefundStatus::Succeeded)
                        | (RefundState::Failed, RefundStatus::Failed)
                        | (RefundState::Processing, RefundStatus::Processing)
                );
                if !agree {
                    violations
                        .push(Violation(format!("refund {name} is {:?} at the channel, {} here", r.status, o.status)));
                }
            }
        }
    }
    let mut numbers = HashSet::new();
    for o in refunds {
        let name = format!("refund {}/{}", o.tenant, o.refund_no);
        if o.merchant_refund_no != merchant_refund_no(&o.refund_no) || !numbers.insert(o.merchant_refund_no.clone()) {
            violations.push(Violation(format!("{name} has the channel number {}", o.merchant_refund_no)));
        }
        let entry = by_payment.entry((o.tenant.clone(), o.request_no.to_string())).or_default();
        match o.status {
            RefundState::Processing => {
                entry.1 += o.amount;
                violations.push(Violation(format!("{name} is left processing")));
            }
            RefundState::Succeeded => {
                entry.0 += o.amount;
                if at_channel.get(&(o.tenant.clone(), o.merchant_refund_no.clone())) != Some(&RefundStatus::Succeeded) {
                    violations.push(Violation(format!("{name} succeeded here, not at the channel")));
                }
            }
            RefundState::Failed => {}
        }
    }
    for (key, p) in payments {
        let (succeeded, processing) = by_payment.get(key).copied().unwrap_or_default();
        if (p.refunded_amount, p.refund_reserved) != (succeeded, processing) {
            violations.push(Violation(format!(
                "payment {}/{} says refunded {} and reserved {}; its refunds say {succeeded} and {processing}",
                key.0, key.1, p.refunded_amount, p.refund_reserved
            )));
        }
    }
}

/// Every payment workflow in `compensation_failed`, page by page.
async fn compensation_failed<S: PaymentStore>(store: &S) -> Result<Vec<WorkflowRecord>, sqlx::Error> {
    let mut all = Vec::new();
    let mut after: Option<Cursor> = None;
    loop {
        let filter = WorkflowFilter {
            state: Some(WorkflowState::CompensationFailed),
            after: after.as_ref(),
            tenant: None,
            name: None,
        };
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
