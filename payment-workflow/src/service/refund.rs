//! Refunding a payment over HTTP: the three layers against duplicates, as for paying (`pay.rs`), and the answer
//! from the workflow or the token; and the reads of refunds.

use std::time::Duration;

use onceflow_engine::Outcome;

use super::{PayResponse, Payments};
use crate::error::Result;
use crate::model::{
    NewRefund, Problem, RefundBody, RefundInput, RefundNo, RefundRecord, RefundState, RequestNo, StoredResponse, Token,
    TokenState, merchant_refund_no, refund_workflow_id,
};
use crate::refunds::{RefundSaga, payment_not_found, refund_failed};
use crate::store::PaymentStore;

/// The route a refund's token is bound to: the payment's own refunds route, so that a token is bound to the
/// payment too.
pub fn refund_route(request_no: &RequestNo) -> String {
    format!("/v1/payments/{request_no}/refunds")
}

impl<S: PaymentStore> Payments<S> {
    /// Refunds `request` of the tenant's payment `request_no` under an idempotency token. Waits up to `wait` for
    /// the final answer, then answers `202`. Concurrent and later repeats get the first final response; another
    /// request under the same token (another payment, other fields, a payment's token) gets `422`.
    ///
    /// As a payment does, the refund starts at once: its first phase refuses a start whose token it cannot claim
    /// or whose payment the tenant does not have, recording nothing, and only then is the token read.
    pub async fn refund(
        &self,
        tenant: &str,
        token: &Token,
        request_no: &RequestNo,
        request: &NewRefund,
        wait: Duration,
    ) -> Result<PayResponse> {
        let input = refund_input(tenant, token, request_no, request);
        match self.run_refund(&input, wait, false).await {
            // Refused (nothing was recorded), attached to a run that was, or the token's workflow runs another
            // request: decide from the token.
            Err(
                onceflow_engine::Error::Refused(_)
                | onceflow_engine::Error::NotFound(_)
                | onceflow_engine::Error::Conflict { .. },
            ) => {}
            // Attached to a workflow recorded before, perhaps ended long ago: the token decides whether there is
            // still an answer to replay (past the response retention there is not), as for payments.
            Ok((response, ended_after_start)) if response.replayed && !ended_after_start => {
                return Ok(match self.store().token_and_payment(token, tenant, request_no).await? {
                    Some(_) => response,
                    None => token_not_found(),
                });
            }
            other => return Ok(other?.0),
        }
        let Some((stored, payment_exists)) = self.store().token_and_payment(token, tenant, request_no).await? else {
            return Ok(token_not_found());
        };
        if stored.tenant != tenant {
            return Ok(token_not_found());
        }
        let bound = |f: &Option<String>, r: &Option<String>| {
            f.as_deref() == Some(&input.fingerprint) && r.as_deref() == Some(&input.route)
        };
        match stored.state {
            TokenState::Completed => {
                if !bound(&stored.fingerprint, &stored.route) {
                    return Ok(mismatch());
                }
                return Ok(PayResponse {
                    status: u16::try_from(stored.response_status.unwrap_or(500)).unwrap_or(500),
                    body: stored.response_body.unwrap_or_default(),
                    replayed: true,
                    location: None,
                });
            }
            TokenState::InUse if !bound(&stored.fingerprint, &stored.route) => return Ok(mismatch()),
            _ if self.expired_unused(&stored) => return Ok(token_not_found()),
            _ => {}
        }
        // The payment must be the tenant's before anything is bound to the token: an unknown one is not stored.
        if !payment_exists {
            return Ok(PayResponse::fresh(payment_not_found(request_no).response()));
        }
        match self.run_refund(&input, wait, stored.state != TokenState::Issued).await {
            Ok((response, _)) => Ok(response),
            Err(onceflow_engine::Error::Conflict { .. }) => Ok(mismatch()),
            Err(onceflow_engine::Error::Refused(_)) => Ok(token_not_found()),
            // Joined another's run of the same request, which stopped with nothing recorded: refused like that
            // (the token expired meanwhile), or stopped by a shutdown or a failing database (503).
            Err(e @ onceflow_engine::Error::NotFound(_)) => {
                match self.store().token_and_payment(token, tenant, request_no).await? {
                    Some((t, _)) if !self.expired_unused(&t) => Err(e.into()),
                    _ => Ok(token_not_found()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Starts (or attaches to) the refund workflow of `input` and answers from its outcome, and whether that
    /// outcome came after the start.
    async fn run_refund(
        &self,
        input: &RefundInput,
        wait: Duration,
        replayed: bool,
    ) -> onceflow_engine::Result<(PayResponse, bool)> {
        let workflow_id = refund_workflow_id(&input.token);
        let handle = self.engine.start::<RefundSaga>(&workflow_id, input).await?;
        let replayed = replayed || handle.attached();
        let outcome = handle.wait(wait).await?;
        let response = match outcome {
            Some(Outcome::Completed(value)) => {
                let response: StoredResponse = serde_json::from_value(value)?;
                PayResponse { replayed, ..PayResponse::fresh(response) }
            }
            // Failed (the channel failed it), or stopped by an operator: the token holds the answer its
            // compensations stored — a refund the channel made after all is answered as made.
            Some(Outcome::Failed(f) | Outcome::CompensationFailed(f) | Outcome::Cancelled(f)) => {
                let stored = self.stored_answer(input).await?;
                let response =
                    stored.unwrap_or_else(|| Problem::of_failure(&f).unwrap_or_else(refund_failed).response());
                PayResponse { replayed, ..PayResponse::fresh(response) }
            }
            None => PayResponse {
                status: 202,
                body: self.processing_body(input).await?.render(),
                replayed: false,
                location: Some(format!("/v1/refunds/{}", input.refund_no)),
            },
        };
        let (refund_no, status) = (&input.refund_no, response.status);
        tracing::info!(%workflow_id, %refund_no, status, replayed, "refund answered");
        Ok((response, handle.ended_after_start()))
    }

    /// The answer stored with the token of `input`, once it holds one.
    async fn stored_answer(&self, input: &RefundInput) -> onceflow_engine::Result<Option<StoredResponse>> {
        let found = self.store().token_and_payment(&input.token, &input.tenant, &input.request_no).await?;
        Ok(found.and_then(|(t, _)| {
            if t.state != TokenState::Completed || t.tenant != input.tenant {
                return None;
            }
            Some(StoredResponse { status: u16::try_from(t.response_status?).ok()?, body: t.response_body? })
        }))
    }

    /// The body of a refund not final yet (`202`): as recorded, or, when this request's refund is not (its first
    /// phase has not committed), as asked.
    async fn processing_body(&self, input: &RefundInput) -> onceflow_engine::Result<RefundBody> {
        if let Some(record) = self.store().refund(&input.tenant, &input.refund_no).await?
            && record.token == input.token
        {
            return Ok(RefundBody { status: RefundState::Processing, refund_id: None, ..record.body() });
        }
        let payment = self.store().payment(&input.tenant, &input.request_no).await?;
        let (order_no, currency) = match payment {
            Some(p) => (p.order_no, p.currency),
            None => return Err(onceflow_engine::Error::NotFound(input.request_no.to_string())),
        };
        let recorded = crate::model::RefundRecorded { created_at: self.now(), currency, order_no };
        Ok(input.body(&recorded, RefundState::Processing, None))
    }

    /// One refund of the tenant.
    pub async fn refund_record(&self, tenant: &str, refund_no: &RefundNo) -> Result<Option<RefundRecord>> {
        Ok(self.store().refund(tenant, refund_no).await?)
    }

    /// Every refund of the tenant's payment `request_no`, newest first; `None` when the tenant has no such
    /// payment.
    pub async fn refunds_of_payment(&self, tenant: &str, request_no: &RequestNo) -> Result<Option<Vec<RefundRecord>>> {
        if self.store().payment(tenant, request_no).await?.is_none() {
            return Ok(None);
        }
        Ok(Some(self.store().refunds_of_payment(tenant, request_no).await?))
    }
}

/// The workflow input of a refund request: bound to its token, its fingerprint and route (which names the
/// payment), the refund's number (the client's, or derived from the token; never replaced) and its channel
/// number.
fn refund_input(tenant: &str, token: &Token, request_no: &RequestNo, request: &NewRefund) -> RefundInput {
    let refund_no = request.refund_no().cloned().unwrap_or_else(|| RefundNo::of_token(token));
    RefundInput {
        tenant: tenant.to_owned(),
        token: token.clone(),
        route: refund_route(request_no),
        fingerprint: request.fingerprint(request_no),
        request_no: request_no.clone(),
        merchant_refund_no: merchant_refund_no(&refund_no),
        refund_no,
        amount: request.amount(),
        reason: request.reason().map(str::to_owned),
    }
}

fn token_not_found() -> PayResponse {
    PayResponse::problem(404, "token_not_found", "Token not found", "the token is unknown or expired")
}

fn mismatch() -> PayResponse {
    PayResponse::problem(
        422,
        "idempotency_key_mismatch",
        "Idempotency key reused",
        "this token was used for a different request",
    )
}
