//! What one entry is, for reconciliation (`contracts/http-api.md`, Reconciliation): each statement line against
//! what onceflow holds under its number, and each final outcome of ours that no line has. Pure: the run feeds it
//! and stores what it says.

use serde_json::{Value, json};

use crate::channel::StatementLine;
use crate::model::{PaymentRecord, PaymentStatus};

/// The classes, each statement line and each final outcome of ours in exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Both final, same status and amount.
    Matched,
    /// Ours was still unknown or processing: the statement's word settles it.
    Resolved,
    /// The channel has an entry under a number onceflow holds nothing for.
    MissingHere,
    /// Both hold the number, their final statuses differ.
    StatusMismatch,
    /// Same number, different amounts, or a line that fails the checks of a channel answer.
    AmountMismatch,
    /// Ours succeeded, and neither that day's complete statement nor its neighbours' hold it.
    MissingAtChannel,
}

impl Class {
    /// Every class, in the order reports show them.
    pub const ALL: [Self; 6] = [
        Self::Matched,
        Self::Resolved,
        Self::MissingHere,
        Self::StatusMismatch,
        Self::AmountMismatch,
        Self::MissingAtChannel,
    ];

    /// As stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Matched => "matched",
            Self::Resolved => "resolved",
            Self::MissingHere => "missing_here",
            Self::StatusMismatch => "status_mismatch",
            Self::AmountMismatch => "amount_mismatch",
            Self::MissingAtChannel => "missing_at_channel",
        }
    }

    /// What reconciliation does about it: nothing for a match, the statement's word recorded for the workflow
    /// to settle (`settled`) for a resolved one, an operator's look for the rest. It never moves money.
    pub fn action(self) -> &'static str {
        match self {
            Self::Matched => "none",
            Self::Resolved => "settled",
            _ => "operator",
        }
    }
}

/// What onceflow holds under a number, as an exception shows it.
pub(crate) fn ours_of_payment(p: &PaymentRecord) -> Value {
    json!({
        "request_no": p.request_no, "order_no": p.order_no, "amount": p.amount, "currency": p.currency,
        "status": p.status, "charge_id": p.charge_id,
    })
}

/// The refund a payment's compensation makes of its charge (`{request_no}-refund`), as an exception shows it.
pub(crate) fn ours_of_compensation(p: &PaymentRecord) -> Value {
    json!({
        "refund_no": p.request_no.refund_no(), "request_no": p.request_no, "amount": p.amount,
        "payment_status": p.status, "compensation": true,
    })
}

/// A charge line against the tenant's payment under its number (`None`: none). `compensated`: a refund of this
/// payment's whole charge by its own compensation is in the statements around (a cancelled payment's charge,
/// taken and given back).
pub(crate) fn charge(line: &StatementLine, ours: Option<&PaymentRecord>, compensated: bool) -> Class {
    let Some(p) = ours else { return Class::MissingHere };
    let checks = line.order_no.as_deref().is_none_or(|o| o == p.order_no.as_str())
        && line.currency.as_deref().is_none_or(|c| c == p.currency.as_str())
        && line.amount == p.amount;
    let charged = line.status == "succeeded";
    let same_status = match p.status {
        PaymentStatus::Processing => return if checks { Class::Resolved } else { Class::AmountMismatch },
        PaymentStatus::Succeeded => charged,
        // A payment that failed after its charge went through is whole again once its compensation refunded
        // it: the money came back, as ours says.
        PaymentStatus::Failed if charged => compensated,
        PaymentStatus::Declined | PaymentStatus::Failed => !charged,
    };
    match (same_status, checks) {
        (false, _) => Class::StatusMismatch,
        (true, false) => Class::AmountMismatch,
        (true, true) => Class::Matched,
    }
}

/// A refund line. Today the refunds onceflow makes are its compensations' (`{request_no}-refund`, the whole
/// charge of a payment that did not succeed); `compensation` is the payment whose compensation number it is.
/// Merchants' refunds (their own table) plug in beside it.
pub(crate) fn refund(line: &StatementLine, compensation: Option<&PaymentRecord>) -> Class {
    let Some(p) = compensation else { return Class::MissingHere };
    let checks = line.merchant_request_no == p.request_no.as_str() && line.amount == p.amount;
    let refunded = line.status == "succeeded";
    let same_status = match p.status {
        // The compensation is still running: the statement's word informs it.
        PaymentStatus::Processing => return if checks { Class::Resolved } else { Class::AmountMismatch },
        // Compensated: ours says the charge came back.
        PaymentStatus::Failed => refunded,
        // A succeeded payment whose compensation's refund the channel failed, or made for part of the charge, rolled
        // forward keeping the rest (the part recorded as refunded): that is what ours says. A whole refund of it
        // contradicts ours.
        PaymentStatus::Succeeded => {
            let ours = line.merchant_request_no == p.request_no.as_str()
                && (!refunded || (line.amount < p.amount && line.amount <= p.refunded_amount));
            return if ours { Class::Matched } else { Class::StatusMismatch };
        }
        // A declined payment had no charge: a refund of it contradicts ours.
        PaymentStatus::Declined => false,
    };
    match (same_status, checks) {
        (false, _) => Class::StatusMismatch,
        (true, false) => Class::AmountMismatch,
        (true, true) => Class::Matched,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::EntryKind;
    use crate::model::{Currency, OrderNo, RequestNo, Token};

    fn payment(no: &str, status: PaymentStatus, amount: i64) -> PaymentRecord {
        PaymentRecord {
            tenant: "t".into(),
            request_no: RequestNo::parse(no).unwrap(),
            order_no: OrderNo::parse("O-1").unwrap(),
            amount,
            currency: Currency::parse("CNY").unwrap(),
            status,
            token: Token::parse("tok_x").unwrap(),
            charge_id: None,
            decline_code: None,
            refunded_amount: 0,
            refund_reserved: 0,
            failure_code: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn line(kind: EntryKind, no: &str, status: &str, amount: i64) -> StatementLine {
        StatementLine {
            kind,
            merchant_request_no: no.trim_end_matches("-refund").into(),
            merchant_refund_no: (kind == EntryKind::Refund).then(|| no.into()),
            charge_id: None,
            refund_id: None,
            order_no: (kind == EntryKind::Charge).then(|| "O-1".into()),
            amount,
            currency: (kind == EntryKind::Charge).then(|| "CNY".into()),
            status: status.into(),
            settled_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn charges_classify_and_status_outranks_amount() {
        use EntryKind::Charge;
        use PaymentStatus::*;
        let ok = line(Charge, "R", "succeeded", 100);
        assert_eq!(charge(&ok, None, false), Class::MissingHere);
        assert_eq!(charge(&ok, Some(&payment("R", Succeeded, 100)), false), Class::Matched);
        assert_eq!(charge(&ok, Some(&payment("R", Succeeded, 90)), false), Class::AmountMismatch);
        assert_eq!(charge(&ok, Some(&payment("R", Declined, 90)), false), Class::StatusMismatch);
        assert_eq!(charge(&ok, Some(&payment("R", Failed, 100)), false), Class::StatusMismatch);
        assert_eq!(charge(&ok, Some(&payment("R", Failed, 100)), true), Class::Matched);
        assert_eq!(charge(&ok, Some(&payment("R", Processing, 100)), false), Class::Resolved);
        assert_eq!(charge(&ok, Some(&payment("R", Processing, 90)), false), Class::AmountMismatch);
        let declined = line(Charge, "R", "declined", 100);
        assert_eq!(charge(&declined, Some(&payment("R", Declined, 100)), false), Class::Matched);
        assert_eq!(charge(&declined, Some(&payment("R", Succeeded, 100)), false), Class::StatusMismatch);
        let mut other_order = ok.clone();
        other_order.order_no = Some("O-2".into());
        assert_eq!(charge(&other_order, Some(&payment("R", Succeeded, 100)), false), Class::AmountMismatch);
    }

    #[test]
    fn compensation_refunds_are_ours() {
        use EntryKind::Refund;
        use PaymentStatus::*;
        let r = line(Refund, "R-refund", "succeeded", 100);
        assert_eq!(refund(&r, None), Class::MissingHere);
        assert_eq!(refund(&r, Some(&payment("R", Failed, 100))), Class::Matched);
        assert_eq!(refund(&r, Some(&payment("R", Failed, 50))), Class::AmountMismatch);
        assert_eq!(refund(&r, Some(&payment("R", Succeeded, 100))), Class::StatusMismatch);
        assert_eq!(refund(&r, Some(&payment("R", Processing, 100))), Class::Resolved);
        assert_eq!(
            refund(&line(Refund, "R-refund", "failed", 100), Some(&payment("R", Failed, 100))),
            Class::StatusMismatch
        );
        // Rolled forward: the compensation's refund failed, or gave back only the part the payment records.
        let kept = payment("R", Succeeded, 100);
        assert_eq!(refund(&line(Refund, "R-refund", "failed", 100), Some(&kept)), Class::Matched);
        let part = PaymentRecord { refunded_amount: 50, ..payment("R", Succeeded, 100) };
        assert_eq!(refund(&line(Refund, "R-refund", "succeeded", 50), Some(&part)), Class::Matched);
        assert_eq!(refund(&line(Refund, "R-refund", "succeeded", 50), Some(&kept)), Class::StatusMismatch);
    }
}
