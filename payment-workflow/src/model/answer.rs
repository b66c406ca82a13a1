//! What a payment answers, typed until it is written: a payment's body, a problem (RFC 9457), and the response
//! stored with a token and replayed byte for byte. Every body of a payment answer is rendered here, once.

use onceflow_engine::Failure;
use serde::{Deserialize, Serialize};

use super::ids::{Currency, OrderNo, RequestNo};
use super::status::PaymentStatus;

/// A final response as stored with its token and replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// HTTP status.
    pub status: u16,
    /// JSON body, exactly as first sent.
    pub body: String,
}

/// A payment as every answer shows it (`201`, `202`, a replay, `GET /v1/payments/{request_no}`). Fields in
/// alphabetical order, as the bodies stored before this type were written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PaymentBody {
    /// Minor units.
    pub amount: i64,
    /// The channel's charge id, once charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    /// ISO 4217.
    pub currency: Currency,
    /// Why the channel declined (on `GET`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// The order.
    pub order_no: OrderNo,
    /// What the merchant's refunds that succeeded gave back (minor units); on `GET` only, so that the bytes of a
    /// payment's stored answer never change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refunded_amount: Option<i64>,
    /// The payment's number.
    pub request_no: RequestNo,
    /// Where the payment is.
    pub status: PaymentStatus,
    /// The workflow that runs the payment (`GET /v1/workflows/{workflow_id}`); on `GET` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
}

impl PaymentBody {
    /// The body's JSON text.
    pub fn render(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A problem answer: its status and stable `code`, and for a decline the channel's reason. The one renderer of
/// every problem body ([`Problem::body`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// HTTP status.
    pub status: u16,
    /// Stable, machine-readable.
    pub code: String,
    /// Short summary.
    pub title: String,
    /// This occurrence.
    pub detail: String,
    /// With `payment_declined`: the channel's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// With `refund_exceeds_payment`: what is left to refund (the charge less every succeeded or in-flight
    /// refund of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refundable: Option<i64>,
}

/// A problem body as RFC 9457 writes it, keys in alphabetical order (the bytes of bodies stored before).
#[derive(Serialize)]
struct ProblemBody<'a> {
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    decline_code: Option<&'a str>,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    refundable: Option<i64>,
    status: u16,
    title: &'a str,
    #[serde(rename = "type")]
    kind: String,
}

impl Problem {
    /// A problem without a decline code.
    pub fn new(status: u16, code: &str, title: &str, detail: &str) -> Self {
        Self {
            status,
            code: code.to_owned(),
            title: title.to_owned(),
            detail: detail.to_owned(),
            decline_code: None,
            refundable: None,
        }
    }

    /// `402` `payment_declined`: the channel declined the charge, for the channel's reason (`declined` when it
    /// gave none).
    pub fn declined(decline_code: Option<String>) -> Self {
        let mut declined = Self::new(402, "payment_declined", "Payment declined", "the channel declined the payment");
        declined.decline_code = Some(decline_code.unwrap_or_else(|| "declined".to_owned()));
        declined
    }

    /// `404 order_not_found`: the tenant has no such order (never stored: the token stays usable).
    pub(crate) fn order_not_found(order_no: &OrderNo) -> Self {
        Self::new(404, "order_not_found", "Order not found", &format!("order {order_no} does not exist"))
    }

    /// `422 amount_mismatch`: amount or currency differ from the order's.
    pub(crate) fn amount_mismatch() -> Self {
        Self::new(422, "amount_mismatch", "Amount mismatch", "amount or currency differ from the order's")
    }

    /// `409 order_not_payable`: the order is paid, or another payment of it is in flight.
    pub(crate) fn order_not_payable(order_no: &OrderNo) -> Self {
        let detail = format!("order {order_no} is paid or has a payment in flight");
        Self::new(409, "order_not_payable", "Order not payable", &detail)
    }

    /// `409 request_no_conflict`: the number is another payment's (here, or at the channel).
    pub(crate) fn request_no_conflict(request_no: &RequestNo) -> Self {
        let detail = format!("request_no {request_no} is already used by another payment");
        Self::new(409, "request_no_conflict", "Request number in use", &detail)
    }

    /// `422 channel_refused`: the channel refused the charge (its own words go to the log, never here).
    pub(crate) fn channel_refused() -> Self {
        let detail = "the payment channel refused the charge; nothing was charged";
        Self::new(422, "channel_refused", "Refused by the channel", detail)
    }

    /// `502 payment_failed`: the answer to a payment whose workflow failed without one (a cancel, an engine
    /// failure).
    pub(crate) fn payment_failed() -> Self {
        Self::new(502, "payment_failed", "Payment failed", "the payment could not be completed")
    }

    /// The answer of a failed payment of `order_no` under `request_no` whose answer's code was `code` (its record
    /// keeps it: `failure_code`), rebuilt byte for byte by the constructors that first built it — for when the
    /// token's stored answer is gone (past the response retention). `None` for a code no failed payment has.
    pub(crate) fn of_failed_payment(code: &str, order_no: &OrderNo, request_no: &RequestNo) -> Option<Self> {
        Some(match code {
            "order_not_found" => Self::order_not_found(order_no),
            "amount_mismatch" => Self::amount_mismatch(),
            "order_not_payable" => Self::order_not_payable(order_no),
            "request_no_conflict" => Self::request_no_conflict(request_no),
            "channel_refused" => Self::channel_refused(),
            "payment_failed" => Self::payment_failed(),
            _ => return None,
        })
    }

    /// The body: `application/problem+json`.
    pub fn body(&self) -> String {
        let body = ProblemBody {
            code: &self.code,
            decline_code: self.decline_code.as_deref(),
            detail: &self.detail,
            refundable: self.refundable,
            status: self.status,
            title: &self.title,
            kind: format!("urn:onceflow:problem:{}", self.code),
        };
        serde_json::to_string(&body).unwrap_or_default()
    }

    /// As stored with a token.
    pub fn response(&self) -> StoredResponse {
        StoredResponse { status: self.status, body: self.body() }
    }

    /// A terminal failure of the payment's workflow whose answer is this problem (what the token stores).
    ///
    /// The details also carry the answer in the shape the previous version wrote and reads (`status`, `body` as
    /// text, `decline_code`), so that during a rolling deploy or after a rollback an older process that
    /// compensates or answers this workflow stores and sends the same answer. Drop them once no such process can
    /// run.
    pub(crate) fn into_failure(self) -> Failure {
        let legacy = LegacyDetails { status: self.status, body: self.body(), decline_code: self.decline_code.clone() };
        let details = FailureDetails { answer: self.clone(), legacy };
        let details = serde_json::to_value(details).unwrap_or_default();
        Failure::new(self.code, self.detail).with_details(details)
    }

    /// The answer a workflow's failure carries, if it carries one.
    pub(crate) fn of_failure(failure: &Failure) -> Option<Self> {
        #[derive(Deserialize)]
        struct Typed {
            answer: Problem,
        }
        if let Ok(Typed { answer }) = serde_json::from_value(failure.details.clone()) {
            return Some(answer);
        }
        legacy_answer(failure)
    }
}

/// The details of a payment workflow's failure: the answer, typed, and as the previous version wrote it.
#[derive(Serialize)]
struct FailureDetails {
    answer: Problem,
    #[serde(flatten)]
    legacy: LegacyDetails,
}

/// A failure's answer as versions before [`Problem`] wrote it: the body as text.
#[derive(Serialize)]
struct LegacyDetails {
    status: u16,
    body: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    decline_code: Option<String>,
}

/// A failure recorded before [`FailureDetails`] (`{"status", "body", "decline_code"}`, the body as text): read so
/// that a payment failed by an earlier version still answers what it answered then.
fn legacy_answer(failure: &Failure) -> Option<Problem> {
    #[derive(Deserialize)]
    struct Legacy {
        status: u16,
        body: String,
    }
    let legacy: Legacy = serde_json::from_value(failure.details.clone()).ok()?;
    let body: serde_json::Value = serde_json::from_str(&legacy.body).ok()?;
    let text = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    Some(Problem {
        status: legacy.status,
        code: text("code")?,
        title: text("title").unwrap_or_default(),
        detail: text("detail").unwrap_or_default(),
        decline_code: text("decline_code"),
        refundable: body.get("refundable").and_then(serde_json::Value::as_i64),
    })
}

/// A problem+json body (RFC 9457) with a stable `code`.
pub fn problem(status: u16, code: &str, title: &str, detail: &str) -> String {
    Problem::new(status, code, title, detail).body()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn bodies_keep_the_bytes_of_before() {
        // What `json!` (sorted keys) wrote before these types, byte for byte.
        let before = json!({"type": "urn:onceflow:problem:x", "title": "T", "status": 404, "detail": "d", "code": "x"});
        assert_eq!(problem(404, "x", "T", "d"), before.to_string());
        let mut declined = Problem::new(402, "payment_declined", "Payment declined", "no");
        declined.decline_code = Some("insufficient_funds".into());
        let mut before =
            serde_json::from_str::<serde_json::Value>(&problem(402, "payment_declined", "Payment declined", "no"))
                .unwrap();
        before["decline_code"] = json!("insufficient_funds");
        assert_eq!(declined.body(), before.to_string());
        let body = PaymentBody {
            amount: 1000,
            charge_id: Some("ch_1".into()),
            currency: Currency::parse("CNY").unwrap(),
            decline_code: None,
            order_no: OrderNo::parse("O-1").unwrap(),
            refunded_amount: None,
            request_no: RequestNo::parse("R-1").unwrap(),
            status: PaymentStatus::Succeeded,
            workflow_id: None,
        };
        let before = json!({"request_no": "R-1", "order_no": "O-1", "amount": 1000, "currency": "CNY",
            "status": "succeeded", "charge_id": "ch_1"});
        assert_eq!(body.render(), before.to_string());
    }

    #[test]
    fn a_failed_payments_answer_is_rebuilt_from_its_code() {
        let (order, request) = (OrderNo::parse("O-1").unwrap(), RequestNo::parse("R-1").unwrap());
        for answer in [
            Problem::order_not_found(&order),
            Problem::amount_mismatch(),
            Problem::order_not_payable(&order),
            Problem::request_no_conflict(&request),
            Problem::channel_refused(),
            Problem::payment_failed(),
        ] {
            let rebuilt = Problem::of_failed_payment(&answer.code, &order, &request).unwrap();
            assert_eq!(rebuilt.response(), answer.response(), "{}", answer.code);
        }
        assert_eq!(Problem::of_failed_payment("payment_declined", &order, &request), None);
    }

    #[test]
    fn a_failure_carries_its_answer_typed_and_legacy_ones_still_read() {
        let mut p = Problem::new(402, "payment_declined", "Payment declined", "no");
        p.decline_code = Some("card".into());
        let failure = p.clone().into_failure();
        assert_eq!(Problem::of_failure(&failure), Some(p.clone()));
        // What the previous version reads (`response_of`: status and body; `fail_record`: decline_code).
        assert_eq!(failure.details["status"], json!(402));
        assert_eq!(failure.details["body"], json!(p.body()));
        assert_eq!(failure.details["decline_code"], json!("card"));
        let legacy = Failure::new("payment_declined", "no")
            .with_details(json!({ "status": 402, "body": p.body(), "decline_code": "card" }));
        assert_eq!(Problem::of_failure(&legacy), Some(p));
        assert_eq!(Problem::of_failure(&Failure::new("x", "y")), None);
    }
}
