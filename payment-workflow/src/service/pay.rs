//! Paying over HTTP: the three layers against duplicates, and the answer from the workflow or the token.

use std::time::Duration;

use onceflow_engine::Outcome;

use super::{PayResponse, Payments};
use crate::error::Result;
use crate::model::{
    PaymentInput, PaymentRequest, PaymentStatus, Problem, RequestNo, StoredResponse, Token, TokenState,
    payment_workflow_id,
};
use crate::payments::PaymentSaga;
use crate::store::PaymentStore;

impl<S: PaymentStore> Payments<S> {
    /// Pays an order under an idempotency token used on `route`. Waits up to `wait` for the final answer, then
    /// answers `202`. Concurrent and later repeats get the first final response; another request under the
    /// same token gets `422`.
    ///
    /// The payment starts at once: its first phase refuses a start whose token it cannot claim or whose order
    /// does not exist, recording nothing, and only then is the token read (a repeat, a mismatch, an unknown
    /// token or order). A fresh payment costs no read before its first commit.
    pub async fn pay(
        &self,
        tenant: &str,
        token: &Token,
        route: &str,
        request: &PaymentRequest,
        wait: Duration,
    ) -> Result<PayResponse> {
        let input = payment_input(tenant, token, route, request);
        match self.run(&input, wait, false).await {
            // Refused (nothing was recorded), attached to a run that was, or the token's workflow runs another
            // request (perhaps another tenant's: only the token says whose): decide from the token.
            Err(
                onceflow_engine::Error::Refused(_)
                | onceflow_engine::Error::NotFound(_)
                | onceflow_engine::Error::Conflict { .. },
            ) => {}
            // Attached to a workflow recorded before, perhaps ended long ago: a history is kept longer than a
            // response, so the token decides whether there is still an answer to replay (past the response
            // retention there is not). Not so for an outcome announced by a run of this process (a storm of
            // repeats that joined the run): it ended after the request, so no retention can have passed since.
            Ok((response, ended_after_start)) if response.replayed && !ended_after_start => {
                return Ok(match self.store().token_and_order(token, tenant, request.order_no()).await? {
                    Some(_) => response,
                    None => not_found(),
                });
            }
            other => return Ok(other?.0),
        }
        let Some((stored, order_exists)) = self.store().token_and_order(token, tenant, request.order_no()).await?
        else {
            return Ok(not_found());
        };
        if stored.tenant != tenant {
            return Ok(not_found());
        }
        let bound = |f: &Option<String>, r: &Option<String>| {
            f.as_deref() == Some(&input.fingerprint) && r.as_deref() == Some(route)
        };
        // A request for an order that does not exist is answered so whoever binds the token: its answer must
        // not depend on whether a concurrent request under the token bound it first (that request, for an order
        // that exists, is the one the token answers from then on).
        let mismatch = || {
            if order_exists {
                mismatch()
            } else {
                PayResponse::fresh(Problem::order_not_found(request.order_no()).response())
            }
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
            TokenState::InUse if !bound(&stored.fingerprint, &stored.route) => {
                return Ok(mismatch());
            }
            _ if self.expired_unused(&stored) => return Ok(not_found()),
            _ => {}
        }
        // The order must exist before anything is bound to the token: an unknown order is not stored.
        if !order_exists {
            return Ok(PayResponse::fresh(Problem::order_not_found(request.order_no()).response()));
        }
        match self.run(&input, wait, stored.state != TokenState::Issued).await {
            Ok((response, _)) => Ok(response),
            // The tenant's token, whose workflow runs another request.
            Err(onceflow_engine::Error::Conflict { .. }) => Ok(mismatch()),
            // The token expired or was taken between the check and the first commit: nothing was stored.
            Err(onceflow_engine::Error::Refused(_)) => Ok(not_found()),
            // This request joined another's run of the same request, which stopped with nothing recorded: refused
            // like that (the token expired meanwhile), or stopped by a shutdown or a failing database, when the
            // token is still good and the request may be made again (503).
            Err(e @ onceflow_engine::Error::NotFound(_)) => {
                match self.store().token_and_order(token, tenant, request.order_no()).await? {
                    Some((t, _)) if !self.expired_unused(&t) => Err(e.into()),
                    _ => Ok(not_found()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Starts (or attaches to) the payment workflow of `input` and answers from its outcome, and whether that
    /// outcome came after the start ([`onceflow_engine::Handle::ended_after_start`]); a workflow of the
    /// token with another request is [`onceflow_engine::Error::Conflict`]. `replayed`: the token was already in
    /// use before this request.
    async fn run(
        &self,
        input: &PaymentInput,
        wait: Duration,
        replayed: bool,
    ) -> onceflow_engine::Result<(PayResponse, bool)> {
        let workflow_id = payment_workflow_id(&input.token);
        let handle = self.engine.start::<PaymentSaga>(&workflow_id, input).await?;
        let replayed = replayed || handle.attached();
        let outcome = handle.wait(wait).await?;
        let response = match outcome {
            Some(Outcome::Completed(value)) => {
                let response: StoredResponse = serde_json::from_value(value)?;
                PayResponse { replayed, ..PayResponse::fresh(response) }
            }
            Some(Outcome::Failed(f) | Outcome::CompensationFailed(f) | Outcome::Cancelled(f)) => {
                let response = Problem::of_failure(&f).unwrap_or_else(Problem::payment_failed).response();
                PayResponse { replayed, ..PayResponse::fresh(response) }
            }
            None => PayResponse {
                status: 202,
                body: input.payment_body(PaymentStatus::Processing, None).render(),
                replayed: false,
                location: Some(format!("/v1/payments/{}", input.request_no)),
            },
        };
        let (request_no, status) = (&input.request_no, response.status);
        tracing::info!(%workflow_id, %request_no, status, replayed, "payment answered");
        Ok((response, handle.ended_after_start()))
    }
}

/// The workflow input of a request: bound to its token, its fingerprint and route, and the payment's number
/// (the client's, or derived from the token; never replaced).
fn payment_input(tenant: &str, token: &Token, route: &str, request: &PaymentRequest) -> PaymentInput {
    PaymentInput {
        tenant: tenant.to_owned(),
        token: token.clone(),
        route: route.to_owned(),
        fingerprint: request.fingerprint(),
        order_no: request.order_no().clone(),
        amount: request.amount(),
        currency: request.currency().clone(),
        request_no: request.request_no().cloned().unwrap_or_else(|| RequestNo::of_token(token)),
    }
}

fn not_found() -> PayResponse {
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
