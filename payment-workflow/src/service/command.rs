//! Paying for a command from a queue: the tenant and `request_no` are the payment's identity.

use std::time::Duration;

use super::{PayResponse, Payments, unused_token};
use crate::error::{Error, Result};
use crate::model::{
    PaymentBody, PaymentRecord, PaymentRequest, PaymentStatus, Problem, RequestNo, StoredResponse, Token, TokenState,
    payment_workflow_id,
};
use crate::store::PaymentStore;

/// The route a queued command's token is bound to (an HTTP token is bound to its path).
pub const COMMAND_ROUTE: &str = "amqp";

impl<S: PaymentStore> Payments<S> {
    /// Pays an order for a command from a queue (`contracts/mq.md`), where the tenant and `request_no` (required)
    /// are the payment's identity and there is no client token. Every delivery of one command meets the same
    /// token, derived from them ([`Token::of_command`]), hence the same workflow and the same answer, however
    /// often and concurrently it is delivered; other fields under the same `request_no` are `422`
    /// `idempotency_key_mismatch`. A `request_no` an HTTP payment of the tenant already used is that payment:
    /// its outcome, never a second charge. Invalid commands are `400` `invalid_request`, and nothing is stored.
    pub async fn pay_command(&self, tenant: &str, request: &PaymentRequest, wait: Duration) -> Result<PayResponse> {
        let Some(request_no) = request.request_no() else {
            return Ok(PayResponse::problem(400, "invalid_request", "Invalid request", "request_no is required"));
        };
        let token = Token::of_command(tenant, request_no);
        let now = self.now();
        let unused = unused_token(tenant, &token, now, self.token_ttl());
        // Ensured under the row's lock, which a retention pass deleting expired tokens may hold too (MySQL
        // deadlocks the two; either may be undone): tried again rather than sending the command back.
        crate::error::again_if_transient(|| async { Ok(self.store().ensure_token(&unused).await?) }).await?;
        let mut response = self.pay(tenant, &token, COMMAND_ROUTE, request, wait).await?;
        if problem_code(&response).as_deref() == Some("order_not_found") {
            // Nothing was recorded, so over HTTP the token stays usable; a command's answer is kept instead, so
            // that a redelivery after the order appears answers the same bytes rather than paying. Not where the
            // number is a payment's already: the settle checks that and the token's state in one statement,
            // which waits for any other write of the token (another delivery's settle, a payment's claim).
            let stored = StoredResponse { status: response.status, body: response.body.clone() };
            let fingerprint = request.fingerprint();
            if !self.store().settle_unused_token(&token, request_no, &fingerprint, COMMAND_ROUTE, &stored, now).await? {
                // Decided on what is there now, as every later delivery decides.
                match self.payment(tenant, request_no).await? {
                    // The number's own payment (a command's for an order that exists, perhaps past its
                    // retention): other fields.
                    Some(record) if record.token == token => return Ok(command_mismatch(request_no)),
                    // An HTTP payment's number: a command with other fields than that payment's (422), and the
                    // command's token stays unsettled, so that a command with the payment's fields is still that
                    // payment. Marked first, so that a settle decided before that payment committed (another
                    // delivery's, on an older snapshot) cannot land after this answer: it fails, or this waits for
                    // it. Unless the token keeps the answer of a command for an unknown order, settled before the
                    // payment took the number: the commands under it answer as then.
                    Some(record) => {
                        self.store().mark_number_taken(&token).await?;
                        if !self.settled_unknown_order(tenant, &token, request).await? {
                            return self.answer_of_payment(tenant, record, request, wait).await;
                        }
                        response = self.pay(tenant, &token, COMMAND_ROUTE, request, wait).await?;
                    }
                    // The token is bound: what it answers (a redelivery's stored answer, another command's
                    // answer for an unknown order, a payment that claimed it meanwhile).
                    None => response = self.pay(tenant, &token, COMMAND_ROUTE, request, wait).await?,
                }
            }
        }
        match problem_code(&response).as_deref() {
            // The token is the command's own, so say so in the command's terms. Unless the command has the fields
            // of its own payment, whose answer and history were deleted (past their retention) and whose token,
            // made again, a command with other fields took first: the record still answers this one.
            // And unless the number is an HTTP payment's that the command's token was bound against: a command with
            // other fields, delivered first, met that payment and bound the token to its own fields (refused); one
            // with that payment's fields is still that payment. Not where the token keeps a command's answer for an
            // unknown order, settled before the HTTP payment took the number: the commands under it were answered
            // `422` then, and keep that answer.
            Some("idempotency_key_mismatch") => match self.payment(tenant, request_no).await? {
                Some(record) if record.token == token && same_fields(&record, request) => {
                    Ok(answer_of_record(&record).unwrap_or_else(|| command_mismatch(request_no)))
                }
                Some(record) if record.token != token => {
                    if self.settled_unknown_order(tenant, &token, request).await? {
                        return Ok(command_mismatch(request_no));
                    }
                    self.answer_of_payment(tenant, record, request, wait).await
                }
                _ => Ok(command_mismatch(request_no)),
            },
            // The number is another payment's (an HTTP one): that payment is the answer. Found here rather than
            // looked up before paying: a first delivery costs no read, and a command that meets an HTTP payment
            // only records its own refused attempt (no order reserved, nothing charged), which every later
            // delivery replays and answers from here the same way.
            Some("request_no_conflict") => match self.payment(tenant, request_no).await? {
                Some(record) if record.token != token => self.answer_of_payment(tenant, record, request, wait).await,
                // The command's own payment, and yet a conflict: its answer and its history were deleted (past
                // their retention), so this delivery started afresh and met its own record. With the record's
                // fields, what the record says (a failure's answer rebuilt from the code it keeps; for one
                // recorded before it kept one, the conflict stands). With other fields, 422.
                Some(record) if same_fields(&record, request) => Ok(answer_of_record(&record).unwrap_or(response)),
                Some(_) => Ok(command_mismatch(request_no)),
                None => Ok(response),
            },
            _ => Ok(response),
        }
    }

    /// Whether the command's `token` keeps the answer to a command for an order that did not exist
    /// (`settle_unused_token`: completed, `404`, nothing recorded).
    async fn settled_unknown_order(&self, tenant: &str, token: &Token, request: &PaymentRequest) -> Result<bool> {
        let found = self.store().token_and_order(token, tenant, request.order_no()).await?;
        Ok(found.is_some_and(|(t, _)| t.state == TokenState::Completed && t.response_status == Some(404)))
    }

    /// The answer to a command whose `request_no` another payment (an HTTP one) already has: with the same
    /// fields, that payment's outcome — its token's stored response, waited for while it runs; with others,
    /// `422`.
    async fn answer_of_payment(
        &self,
        tenant: &str,
        record: PaymentRecord,
        request: &PaymentRequest,
        wait: Duration,
    ) -> Result<PayResponse> {
        if !same_fields(&record, request) {
            return Ok(command_mismatch(&record.request_no));
        }
        let stored = || async {
            let found = self.store().token_and_order(&record.token, tenant, &record.order_no).await?;
            Ok::<_, Error>(found.and_then(|(t, _)| {
                if t.state != TokenState::Completed || t.tenant != tenant {
                    return None;
                }
                let status = u16::try_from(t.response_status?).ok()?;
                Some(PayResponse { status, body: t.response_body?, replayed: true, location: None })
            }))
        };
        if let Some(response) = stored().await? {
            return Ok(response);
        }
        // A final payment's token holds its response, written by the commit that ended its workflow.
        match self.engine.wait(&payment_workflow_id(&record.token), wait).await {
            Ok(Some(_)) => {
                if let Some(response) = stored().await? {
                    return Ok(response);
                }
            }
            Ok(None) => return Ok(processing(&record)),
            Err(onceflow_engine::Error::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        // Neither the token's response nor the workflow is kept any more: what the record says.
        Ok(answer_of_record(&record).unwrap_or_else(|| {
            let detail = format!("request_no {} is already used by another payment", record.request_no);
            PayResponse::problem(409, "request_no_conflict", "Request number in use", &detail)
        }))
    }
}

/// Whether `request` asks for what the payment of `record` was for (its order, amount and currency).
fn same_fields(record: &PaymentRecord, request: &PaymentRequest) -> bool {
    record.order_no == *request.order_no()
        && record.amount == request.amount()
        && record.currency == *request.currency()
}

/// A payment's answer from its record alone, for when neither its token's stored answer nor its workflow is kept:
/// a charge (`201`, the bytes it was answered with), a decline (`402`, likewise), a failure (its answer, rebuilt
/// from the code the record keeps), a payment still running (`202`); `None` for a failed one recorded before its
/// record kept the code.
fn answer_of_record(record: &PaymentRecord) -> Option<PayResponse> {
    let replayed = |r: StoredResponse| PayResponse { replayed: true, ..PayResponse::fresh(r) };
    match record.status {
        PaymentStatus::Succeeded => Some(replayed(StoredResponse { status: 201, body: record.body().render() })),
        PaymentStatus::Declined => Some(replayed(Problem::declined(record.decline_code.clone()).response())),
        PaymentStatus::Processing => Some(processing(record)),
        PaymentStatus::Failed => record
            .failure_code
            .as_deref()
            .and_then(|code| Problem::of_failed_payment(code, &record.order_no, &record.request_no))
            .map(|answer| replayed(answer.response())),
    }
}

/// The `code` of a problem answer.
fn problem_code(response: &PayResponse) -> Option<String> {
    if response.status < 400 {
        return None;
    }
    let body: serde_json::Value = serde_json::from_str(&response.body).ok()?;
    body.get("code")?.as_str().map(str::to_owned)
}

fn command_mismatch(request_no: &RequestNo) -> PayResponse {
    let detail = format!("request_no {request_no} was used for a different request");
    PayResponse::problem(422, "idempotency_key_mismatch", "Idempotency key reused", &detail)
}

/// `202`: the payment of `record` is not final yet.
fn processing(record: &PaymentRecord) -> PayResponse {
    PayResponse {
        status: 202,
        body: PaymentBody { status: PaymentStatus::Processing, charge_id: None, ..record.body() }.render(),
        replayed: false,
        location: Some(format!("/v1/payments/{}", record.request_no)),
    }
}
