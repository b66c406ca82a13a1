//! The problems a refund answers with (`contracts/http-api.md`, Refunds): each stored with its token and
//! replayed, but for `payment_not_found`, which nothing is recorded for.

use crate::model::{Problem, RefundNo, RequestNo};

/// `404 payment_not_found`: the tenant has no payment `request_no` (another tenant's is none of its own).
pub(crate) fn payment_not_found(request_no: &RequestNo) -> Problem {
    Problem::new(404, "payment_not_found", "Payment not found", &format!("payment {request_no} does not exist"))
}

/// `409 payment_not_refundable`: the payment is not `succeeded` (still processing, declined or failed).
pub(super) fn not_refundable(request_no: &RequestNo) -> Problem {
    let detail = format!("payment {request_no} has not succeeded: only a succeeded payment can be refunded");
    Problem::new(409, "payment_not_refundable", "Payment not refundable", &detail)
}

/// `409 refund_exceeds_payment`, with what is left to refund.
pub(super) fn exceeds(refundable: i64) -> Problem {
    let detail = format!("more than is left to refund: {refundable} (minor units)");
    let mut problem = Problem::new(409, "refund_exceeds_payment", "Refund exceeds payment", &detail);
    problem.refundable = Some(refundable);
    problem
}

/// `409 refund_no_conflict`: the tenant's `refund_no` is another refund's (numbers are never reused).
pub(super) fn number_in_use(refund_no: &RefundNo) -> Problem {
    let detail = format!("refund_no {refund_no} is already used by another refund");
    Problem::new(409, "refund_no_conflict", "Refund number in use", &detail)
}

/// `422 refund_failed`: the channel failed the refund or refused it; nothing was refunded, and its amount is
/// refundable again.
pub(crate) fn refund_failed() -> Problem {
    let detail = "the payment channel did not refund it; nothing was refunded, and the amount can be refunded again";
    Problem::new(422, "refund_failed", "Refund failed", detail)
}
