//! The invariants a payment system must keep, checked against the channel's ledger and the database.

use std::collections::HashMap;

use crate::channel::Ledger;
use crate::model::{OrderStatus, PaymentStatus};
use crate::store::PaymentStore;

/// One broken invariant, said plainly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

/// Checks, per tenant (the channel's merchant): every order has at most one kept (succeeded, not refunded)
/// charge; an order is `paid` exactly when it has one; every kept charge has this tenant's `succeeded` payment
/// record of the same order and amount; every refunded charge was this tenant's own payment's; no order is
/// left `paying` and no payment `processing` (call after recovery has run).
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
    Ok(violations)
}
