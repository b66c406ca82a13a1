//! The invariants a payment system must keep, checked against the channel's ledger and the database.

use std::collections::HashMap;

use crate::channel::{ChargeStatus, Ledger};
use crate::model::{order_status, payment_status};
use crate::store::PaymentStore;

/// One broken invariant, said plainly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

/// Checks, for a single-tenant run: every order has at most one kept (succeeded, unrefunded) charge; an order
/// is `paid` exactly when it has one; every succeeded charge has a `succeeded` payment record (or was
/// refunded); no order is left `paying` and no payment `processing` (call after recovery has run).
pub async fn check_invariants<S: PaymentStore>(store: &S, ledger: &Ledger) -> Result<Vec<Violation>, sqlx::Error> {
    let mut violations = Vec::new();
    let orders = store.all_orders().await?;
    let payments: HashMap<String, _> =
        store.all_payments().await?.into_iter().map(|p| (p.request_no.clone(), p)).collect();
    for order in &orders {
        let kept = ledger.kept_charges(&order.order_no);
        if kept > 1 {
            violations.push(Violation(format!("order {} was charged {kept} times", order.order_no)));
        }
        let paid = order.status == order_status::PAID;
        if paid != (kept == 1) {
            violations
                .push(Violation(format!("order {} is {} with {kept} kept charges", order.order_no, order.status)));
        }
        if order.status == order_status::PAYING {
            violations.push(Violation(format!("order {} is left paying", order.order_no)));
        }
    }
    for charge in ledger.charges.iter().filter(|c| c.status == ChargeStatus::Succeeded && !c.refunded) {
        match payments.get(&charge.merchant_request_no) {
            Some(p) if p.status == payment_status::SUCCEEDED => {}
            Some(p) => violations.push(Violation(format!(
                "charge {} succeeded but its payment is {}",
                charge.merchant_request_no, p.status
            ))),
            None => violations.push(Violation(format!("charge {} has no payment record", charge.merchant_request_no))),
        }
    }
    for p in payments.values().filter(|p| p.status == payment_status::PROCESSING) {
        violations.push(Violation(format!("payment {} is left processing", p.request_no)));
    }
    Ok(violations)
}
