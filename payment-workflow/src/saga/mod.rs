//! The payment saga: `claim_token`, `insert_record`, `reserve_status` (one atomic phase), `call_channel`
//! (external), `confirm`; with the compensations DESIGN.md lists.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::{
    Attempt, BoxFuture, Compensation, Failure, Interrupt, Previous, RetryPolicy, StepError, StepSpec, Workflow,
    WorkflowContext, step,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::channel::{Channel, ChannelError, Charge, ChargeRequest, ChargeStatus, Closed, RefundRequest, RefundStatus};
use crate::model::{PaymentRecord, StoredResponse, order_status, payment_status, problem};
use crate::store::{PaymentStore, Reserve, phases};

/// What a payment workflow is started with: the request, resolved and bound to its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentInput {
    /// Owner.
    pub tenant: String,
    /// The idempotency token.
    pub token: String,
    /// The route the token is used on.
    pub route: String,
    /// SHA-256 of the canonical request fields.
    pub fingerprint: String,
    /// The order.
    pub order_no: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// The payment's number: given by the client or derived from the token; never replaced.
    pub request_no: String,
}

impl PaymentInput {
    /// The body of a succeeded payment (`201`), and of `GET /v1/payments/{request_no}` once paid.
    pub(crate) fn payment_body(&self, status: &str, charge_id: Option<&str>) -> String {
        let mut body = json!({
            "request_no": self.request_no,
            "order_no": self.order_no,
            "amount": self.amount,
            "currency": self.currency,
            "status": status,
        });
        if let Some(id) = charge_id {
            body["charge_id"] = json!(id);
        }
        body.to_string()
    }

    fn refund_no(&self) -> String {
        format!("{}-refund", self.request_no)
    }

    /// The charge this payment asks the channel for: as the tenant's merchant (its merchant id is the tenant's
    /// name), under the payment's own number.
    fn charge_request(&self) -> ChargeRequest {
        ChargeRequest {
            merchant_id: self.tenant.clone(),
            merchant_request_no: self.request_no.clone(),
            order_no: self.order_no.clone(),
            amount: self.amount,
            currency: self.currency.clone(),
        }
    }
}

/// What the channel step ended with (a decline is an answer, not an error of the step).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum ChargeOutcome {
    Charged {
        charge_id: String,
    },
    Declined {
        decline_code: Option<String>,
    },
    /// A refusal (`4xx`) of this attempt's request: it charged nothing. The channel's answer is kept here, for
    /// operators. `after_unknown`: an earlier attempt's request may still be in flight (a refusal speaks only
    /// for its own request), so the number must still be closed before anything is undone.
    Refused {
        status: u16,
        body: String,
        #[serde(default)]
        after_unknown: bool,
    },
    /// The channel holds a charge under this number that is not this payment's (another merchant's, or other
    /// fields): someone else's, never success for this payment, never refunded by it.
    NotOurs,
}

/// The payment workflow type.
pub struct PaymentSaga {
    channel: Arc<dyn Channel>,
    channel_retry: RetryPolicy,
}

impl PaymentSaga {
    /// A saga charging through `channel`.
    pub fn new(channel: Arc<dyn Channel>) -> Self {
        let channel_retry = RetryPolicy {
            initial_interval: Duration::from_millis(50),
            multiplier: 2.0,
            max_interval: Duration::from_secs(5),
            max_attempts: 20,
            jitter: true,
        };
        Self { channel, channel_retry }
    }
}

/// A terminal failure carrying the response the client gets (and the token stores).
fn failure_with_response(status: u16, code: &str, title: &str, detail: &str) -> Failure {
    let body = problem(status, code, title, detail);
    Failure::new(code, detail).with_details(json!({ "status": status, "body": body }))
}

/// The response a failure carries, if it carries one.
pub(crate) fn response_of(failure: &Failure) -> Option<StoredResponse> {
    let status = u16::try_from(failure.details.get("status")?.as_u64()?).ok()?;
    let body = failure.details.get("body")?.as_str()?.to_owned();
    Some(StoredResponse { status, body })
}

impl<S: PaymentStore> Workflow<S> for PaymentSaga {
    const NAME: &'static str = "payment";
    type Input = PaymentInput;
    type Output = StoredResponse;

    async fn run(&self, ctx: &mut WorkflowContext<S>, input: PaymentInput) -> Result<StoredResponse, Interrupt> {
        let now = ctx.now_ms();
        let i = &input;

        // Phase 1, one commit: claim the token, insert the record, reserve the order.
        let [claim, insert, reserve_spec] = [
            step("claim_token").compensate_with("store_response", ()),
            step("insert_record").compensate_with("fail_record", ()),
            step("reserve_status").compensate_with("release_order", ()),
        ];
        let charge_spec = step("call_channel").retry(self.channel_retry).compensate_with("refund", ());
        let not_claimed = || {
            // Checked before the start; only an expiry in between gets here.
            failure_with_response(404, "token_not_found", "Token not found", "the token is unknown or expired")
        };
        let reserve = if let Some(dialect) = S::STATEMENT_PHASES {
            let phase =
                phases::reserve(dialect, i, now, [claim, insert, reserve_spec, charge_spec.clone()], not_claimed());
            // Outputs: claimed (always, past the guard), inserted, the reservation (once inserted), the intent.
            let outputs = ctx.statement_phase(phase).await?;
            let inserted: bool = decode(outputs.get(1))?;
            if inserted { Some(decode(outputs.get(2))?) } else { None }
        } else {
            reserve_steps::<S>(ctx, i, now, [claim, insert, reserve_spec], not_claimed()).await?
        };
        let Some(reserve) = reserve else {
            let detail = format!("request_no {} is already used by another payment", i.request_no);
            return reject::<S>(ctx, i, false, 409, "request_no_conflict", "Request number in use", &detail).await;
        };
        match reserve {
            Reserve::Reserved => {}
            Reserve::NotFound => {
                let detail = format!("order {} does not exist", i.order_no);
                return reject::<S>(ctx, i, true, 404, "order_not_found", "Order not found", &detail).await;
            }
            Reserve::Mismatch => {
                let detail = "amount or currency differ from the order's";
                return reject::<S>(ctx, i, true, 422, "amount_mismatch", "Amount mismatch", detail).await;
            }
            Reserve::NotPayable => {
                let detail = format!("order {} is paid or has a payment in flight", i.order_no);
                return reject::<S>(ctx, i, true, 409, "order_not_payable", "Order not payable", &detail).await;
            }
        }

        // The channel call: intent committed before, outcome after; an unknown outcome is resolved by the same
        // request_no, never by a new one.
        let request = i.charge_request();
        let channel = &self.channel;
        let outcome = ctx.external(charge_spec, |attempt| charge(channel.as_ref(), &request, attempt)).await?;
        let charge_id = match outcome {
            ChargeOutcome::Charged { charge_id } => charge_id,
            ChargeOutcome::Declined { decline_code } => {
                let code = decline_code.unwrap_or_else(|| "declined".to_owned());
                let mut body: serde_json::Value = serde_json::from_str(&problem(
                    402,
                    "payment_declined",
                    "Payment declined",
                    "the channel declined the payment",
                ))
                .unwrap_or_default();
                body["decline_code"] = json!(code);
                let failure = Failure::new("payment_declined", "the channel declined the payment")
                    .with_details(json!({ "status": 402, "body": body.to_string(), "decline_code": code }));
                return Err(Interrupt::Failed(failure));
            }
            ChargeOutcome::Refused { status, body, .. } => {
                // The channel's answer stays in the step's output and the log, never in the client's problem.
                tracing::warn!(request_no = %i.request_no, status, %body, "the channel refused the charge");
                let detail = "the payment channel refused the charge; nothing was charged";
                let f = failure_with_response(422, "channel_refused", "Refused by the channel", detail);
                return Err(Interrupt::Failed(f));
            }
            ChargeOutcome::NotOurs => {
                tracing::warn!(request_no = %i.request_no, "the channel holds another payment's charge under this number");
                let detail = format!("request_no {} is already used by another payment", i.request_no);
                let f = failure_with_response(409, "request_no_conflict", "Request number in use", &detail);
                return Err(Interrupt::Failed(f));
            }
        };

        // Phase 2, one commit with the channel's outcome: paid, succeeded, the token's response stored.
        let body = i.payment_body(payment_status::SUCCEEDED, Some(&charge_id));
        let not_paying = || Failure::new("order_not_paying", "the order left paying");
        let response = StoredResponse { status: 201, body: body.clone() };
        if let Some(dialect) = S::STATEMENT_PHASES {
            let phase = phases::confirm(dialect, i, now, step("confirm"), &charge_id, &response, not_paying());
            // Written by the commit that completes the workflow: one statement for the channel's outcome,
            // `confirm`, and the workflow's end.
            return ctx.finish_with(phase, response).await;
        }
        let (tenant, order_no, request_no, token) =
            (i.tenant.clone(), i.order_no.clone(), i.request_no.clone(), i.token.clone());
        ctx.transactional("confirm", move |c| -> BoxFuture<'_, _> {
            Box::pin(async move {
                if !S::confirm_payment(c, tenant, order_no, request_no, charge_id, token, body.clone(), now).await? {
                    return Err(StepError::Terminal(not_paying()));
                }
                Ok(StoredResponse { status: 201, body })
            })
        })
        .await
    }

    async fn compensate(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &Compensation,
        failure: &Failure,
    ) -> Result<(), Interrupt> {
        // Compensations are registered without input: the workflow's own input says everything, and the forward
        // step's output says what it did. Each undoes exactly that, guarded by what it wrote (this payment's
        // token, record and reservation), so it is a no-op on anything another payment owns.
        let i: PaymentInput = ctx.input()?;
        let now = ctx.now_ms();
        let wrote = compensation.forward.as_ref().and_then(serde_json::Value::as_bool) == Some(true);
        match compensation.name.as_str() {
            "refund" => {
                let done: Option<ChargeOutcome> =
                    compensation.forward.clone().and_then(|f| serde_json::from_value(f).ok());
                let charged = match done {
                    // A definite answer that charged nothing of this payment's: nothing to undo.
                    Some(
                        ChargeOutcome::Declined { .. }
                        | ChargeOutcome::NotOurs
                        | ChargeOutcome::Refused { after_unknown: false, .. },
                    ) => return Ok(()),
                    Some(ChargeOutcome::Charged { .. }) => true,
                    // Unknown, or refused while an earlier request may be in flight: close the number first.
                    Some(ChargeOutcome::Refused { after_unknown: true, .. }) | None => false,
                };
                let channel = &self.channel;
                let undo = |_| undo_charge(channel.as_ref(), &i, charged);
                let undone = ctx.external(step("refund").retry(self.channel_retry), undo).await?;
                tracing::info!(request_no = %i.request_no, ?undone, "charge undone");
                Ok(())
            }
            "release_order" => {
                let reserved: Option<Reserve> =
                    compensation.forward.clone().and_then(|f| serde_json::from_value(f).ok());
                if reserved != Some(Reserve::Reserved) {
                    return Ok(());
                }
                let (tenant, order_no, request_no) = (i.tenant.clone(), i.order_no.clone(), i.request_no.clone());
                ctx.transactional("release_order", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        S::move_order(c, tenant, order_no, request_no, order_status::PENDING, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            "fail_record" => {
                if !wrote {
                    return Ok(());
                }
                let declined = failure.code == "payment_declined";
                let status = if declined { payment_status::DECLINED } else { payment_status::FAILED };
                let code = failure.details.get("decline_code").and_then(|c| c.as_str()).map(str::to_owned);
                let (tenant, request_no, token) = (i.tenant.clone(), i.request_no.clone(), i.token.clone());
                ctx.transactional("fail_record", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        S::set_payment_status(c, tenant, request_no, token, status, None, code, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            "store_response" => {
                if !wrote {
                    return Ok(());
                }
                let response = response_of(failure).unwrap_or_else(|| StoredResponse {
                    status: 502,
                    body: problem(502, "payment_failed", "Payment failed", "the payment could not be completed"),
                });
                let token = i.token.clone();
                ctx.transactional("store_response", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        S::complete_token(c, token, i32::from(response.status), response.body, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            other => Err(Interrupt::Failed(Failure::new("unknown_compensation", other.to_owned()))),
        }
    }
}

/// Phase 1 as closure steps, for stores without statement phases: the order's reservation, or `None` when the
/// record's `request_no` is taken.
async fn reserve_steps<S: PaymentStore>(
    ctx: &mut WorkflowContext<S>,
    i: &PaymentInput,
    now: i64,
    [claim, insert, reserve]: [StepSpec; 3],
    not_claimed: Failure,
) -> Result<Option<Reserve>, Interrupt> {
    let (token, tenant, fingerprint, route) =
        (i.token.clone(), i.tenant.clone(), i.fingerprint.clone(), i.route.clone());
    if !ctx.transactional(claim, move |c| S::claim_token(c, token, tenant, fingerprint, route, now)).await? {
        return Err(Interrupt::Failed(not_claimed));
    }
    let record = PaymentRecord {
        tenant: i.tenant.clone(),
        request_no: i.request_no.clone(),
        order_no: i.order_no.clone(),
        amount: i.amount,
        currency: i.currency.clone(),
        status: payment_status::PROCESSING.to_owned(),
        token: i.token.clone(),
        charge_id: None,
        decline_code: None,
        created_at: now,
        updated_at: now,
    };
    if !ctx.transactional(insert, move |c| S::insert_payment(c, record)).await? {
        return Ok(None);
    }
    let (tenant, order_no, currency, amount) = (i.tenant.clone(), i.order_no.clone(), i.currency.clone(), i.amount);
    let request_no = i.request_no.clone();
    let reserved = ctx
        .transactional(reserve, move |c| S::reserve_order(c, tenant, order_no, amount, currency, request_no, now))
        .await?;
    Ok(Some(reserved))
}

/// A statement phase step's output as its type.
fn decode<T: serde::de::DeserializeOwned>(output: Option<&Option<serde_json::Value>>) -> Result<T, Interrupt> {
    let value = output.and_then(Option::as_ref).unwrap_or(&serde_json::Value::Null);
    T::deserialize(value).map_err(|e| Interrupt::Engine(e.into()))
}

/// A rejection decided before the channel: stored on the token (and on the record when it is ours), replayed.
async fn reject<S: PaymentStore>(
    ctx: &mut WorkflowContext<S>,
    i: &PaymentInput,
    record_is_ours: bool,
    status: u16,
    code: &str,
    title: &str,
    detail: &str,
) -> Result<StoredResponse, Interrupt> {
    let now = ctx.now_ms();
    let response = StoredResponse { status, body: problem(status, code, title, detail) };
    let (tenant, request_no, token) = (i.tenant.clone(), i.request_no.clone(), i.token.clone());
    let stored = response.clone();
    ctx.transactional("reject", move |c| -> BoxFuture<'_, _> {
        Box::pin(async move {
            if record_is_ours {
                let (failed, ours) = (payment_status::FAILED, token.clone());
                S::set_payment_status(&mut *c, tenant, request_no, ours, failed, None, None, now).await?;
            }
            S::complete_token(&mut *c, token, i32::from(stored.status), stored.body, now).await?;
            Ok(())
        })
    })
    .await?;
    Ok(response)
}

/// What a charge the channel answered with means for the payment that asked for `request`.
fn settle(charge: Charge, request: &ChargeRequest) -> Result<ChargeOutcome, StepError> {
    if !charge.matches(request) {
        return Ok(ChargeOutcome::NotOurs);
    }
    match charge.status {
        ChargeStatus::Succeeded => Ok(ChargeOutcome::Charged { charge_id: charge.charge_id }),
        ChargeStatus::Declined => Ok(ChargeOutcome::Declined { decline_code: charge.decline_code }),
        ChargeStatus::Processing => Err(StepError::UnknownOutcome("the charge is processing".into())),
    }
}

/// Counts a channel call by what came of it, for `/metrics`.
fn count_call(outcome: &Result<ChargeOutcome, StepError>) {
    let label = match outcome {
        Ok(ChargeOutcome::Charged { .. }) => "succeeded",
        Ok(ChargeOutcome::Declined { .. }) => "declined",
        Ok(ChargeOutcome::Refused { .. }) => "refused",
        Ok(ChargeOutcome::NotOurs) => "not_ours",
        Err(StepError::UnknownOutcome(m)) if m.contains("processing") => "processing",
        Err(_) => "unknown",
    };
    metrics::counter!("onceflow_channel_calls_total", "outcome" => label).increment(1);
}

/// One attempt of the channel call, counted.
async fn charge(channel: &dyn Channel, request: &ChargeRequest, attempt: Attempt) -> Result<ChargeOutcome, StepError> {
    let outcome = charge_attempt(channel, request, attempt).await;
    count_call(&outcome);
    outcome
}

/// One attempt of the channel call. After an attempt that may have charged, the charge is looked up by the
/// same number first; the channel also deduplicates a repeated charge request. Every charge the channel
/// answers with is checked against this payment: one that does not match is someone else's.
async fn charge_attempt(
    channel: &dyn Channel,
    request: &ChargeRequest,
    attempt: Attempt,
) -> Result<ChargeOutcome, StepError> {
    if attempt.previous != Previous::None {
        match channel.query(&request.merchant_id, &request.merchant_request_no).await {
            Ok(Some(found)) => return settle(found, request),
            Ok(None) => {}
            Err(e) => return Err(StepError::UnknownOutcome(e.to_string())),
        }
    }
    match channel.charge(request).await {
        Ok(charge) => settle(charge, request),
        Err(ChannelError::Refused { status, body }) => {
            Ok(ChargeOutcome::Refused { status, body, after_unknown: attempt.previous != Previous::None })
        }
        Err(e) => Err(StepError::UnknownOutcome(e.to_string())),
    }
}

/// How a charge's number was undone at the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Undone {
    /// Closed before any charge was accepted: none ever will be.
    Closed,
    /// This payment's charge was refunded.
    Refunded,
    /// The charge under the number settled without taking money (declined).
    NothingTaken,
    /// The charge under the number is not this payment's: left alone.
    NotOurs,
}

/// Undoes whatever this payment's number did at the channel: closes the number first (so that a charge still
/// in flight can no longer land), then refunds this payment's charge if one exists, under a stable refund
/// number, once a `processing` one has settled. `charged`: the charge step already saw this payment's charge
/// succeed, so there is nothing to close and it is refunded at once.
async fn undo_charge(channel: &dyn Channel, i: &PaymentInput, charged: bool) -> Result<Undone, StepError> {
    let request = i.charge_request();
    let unknown = |e: ChannelError| StepError::UnknownOutcome(e.to_string());
    if !charged {
        let charge = match channel.close(&request.merchant_id, &request.merchant_request_no).await {
            Ok(Closed::Closed) => return Ok(Undone::Closed),
            Ok(Closed::Charged(charge)) => charge,
            // Not an answer to wait out: an operator must look (the workflow ends compensation_failed).
            Err(ChannelError::Refused { status, body }) => {
                tracing::warn!(request_no = %i.request_no, status, %body, "the channel refused to close the number");
                return Err(StepError::terminal("close_refused", "the channel refused to close the charge's number"));
            }
            Err(e) => return Err(unknown(e)),
        };
        if !charge.matches(&request) {
            tracing::warn!(request_no = %i.request_no, "the charge under this number is another payment's: not refunded");
            return Ok(Undone::NotOurs);
        }
        match charge.status {
            ChargeStatus::Declined => return Ok(Undone::NothingTaken),
            ChargeStatus::Processing => return Err(StepError::UnknownOutcome("the charge is processing".into())),
            ChargeStatus::Succeeded => {}
        }
    }
    let refund = RefundRequest {
        merchant_id: request.merchant_id.clone(),
        merchant_refund_no: i.refund_no(),
        merchant_request_no: request.merchant_request_no.clone(),
        amount: i.amount,
    };
    match channel.refund(&refund).await {
        Ok(r) if r.status == RefundStatus::Succeeded => Ok(Undone::Refunded),
        Ok(r) if r.status == RefundStatus::Processing => Err(StepError::UnknownOutcome("refund processing".into())),
        Ok(_) => Err(StepError::terminal("refund_failed", "the channel refused the refund")),
        Err(ChannelError::Refused { status, body }) => {
            tracing::warn!(request_no = %i.request_no, status, %body, "the channel refused the refund");
            Err(StepError::terminal("refund_refused", "the channel refused the refund"))
        }
        Err(e) => Err(unknown(e)),
    }
}
