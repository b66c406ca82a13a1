//! Delivering the channel's word to what holds its number: the workflow of a payment or refund still waiting on
//! the channel is woken ([`Engine::wake`]: an event from outside, durably recorded before, ends its wait now),
//! and its attempt applies the word through the same checks as a channel answer (`word.rs`). A word on a payment
//! or refund that is already final changes nothing: it is marked as agreeing or contradicting (an exception for
//! operators, logged); one on a number onceflow does not hold is kept as evidence for reconciliation.
//!
//! The notification endpoint delivers each word as it is recorded; [`spawn_word_delivery`] delivers what is
//! left (a word recorded while its workflow ran in another process, a statement's settlements, words recorded
//! just before a crash) every second.

use std::time::Duration;

use onceflow_engine::{Engine, Woken};

use super::word::{WordOutcome, charge_of, mark_all, refund_of};
use crate::channel::{ChargeRequest, ChargeStatus, RefundRequest, RefundStatus};
use crate::model::{
    PaymentRecord, PaymentStatus, RefundNo, RefundState, RequestNo, payment_workflow_id, refund_no_of,
    refund_workflow_id,
};
use crate::store::{ChannelWord, PaymentStore};

/// What delivering a word came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// The workflow holding its number was woken: its attempt applies the word now (or, when another process
    /// runs it, at its next attempt, within seconds).
    Woken(Woken),
    /// Marked taken up as this, without any workflow: a final status, no holder, a workflow ended without
    /// settling it.
    Marked(WordOutcome),
    /// Nothing to do now (its workflow is between two states): delivered again by the next pass.
    Later,
}

/// What holds a word's number, as far as delivering it goes.
enum Holder {
    /// No payment or refund of the tenant's has the number.
    None,
    /// Still waiting on the channel: the workflow to wake.
    Open(String),
    /// Final: what the word comes to against it.
    Final(WordOutcome),
}

/// Delivers `word` (see the module).
pub async fn deliver_word<S: PaymentStore>(
    engine: &Engine<S>,
    word: &ChannelWord,
) -> Result<Delivered, onceflow_engine::Error> {
    let outcome = match holder(engine.store(), word).await? {
        Holder::Open(workflow_id) => match engine.wake(&workflow_id).await {
            Ok(woken) => {
                tracing::info!(%workflow_id, id = %word.notification_id, number = %word.number, ?woken,
                    "the channel's word delivered: the workflow holding its number is woken");
                return Ok(Delivered::Woken(woken));
            }
            Err(onceflow_engine::Error::ShuttingDown) => return Ok(Delivered::Later),
            // Ended: settled meanwhile (its record final now), or ended without settling (compensation_failed,
            // its record still processing), for an operator.
            Err(onceflow_engine::Error::InvalidState { .. } | onceflow_engine::Error::NotFound(_)) => {
                match holder(engine.store(), word).await? {
                    Holder::Open(_) => WordOutcome::ForOperator,
                    Holder::None => WordOutcome::Unheld,
                    Holder::Final(outcome) => outcome,
                }
            }
            Err(e) => return Err(e),
        },
        Holder::None => WordOutcome::Unheld,
        Holder::Final(outcome) => outcome,
    };
    if matches!(outcome, WordOutcome::Contradicts | WordOutcome::NotOurs | WordOutcome::ForOperator) {
        metrics::counter!("onceflow_channel_word_exceptions_total", "outcome" => outcome.as_str()).increment(1);
        tracing::warn!(tenant = %word.tenant, kind = %word.kind, number = %word.number, status = %word.status,
            id = %word.notification_id, source = %word.source, outcome = outcome.as_str(),
            "the channel's word settles nothing of onceflow's record: nothing changed, an exception for operators");
    }
    mark_all(engine.store(), std::slice::from_ref(word), outcome).await;
    Ok(Delivered::Marked(outcome))
}

/// What holds `word`'s number.
async fn holder<S: PaymentStore>(store: &S, word: &ChannelWord) -> Result<Holder, sqlx::Error> {
    Ok(match word.kind.as_str() {
        "charge" => match RequestNo::parse(word.number.clone()) {
            Ok(no) => match store.payment(&word.tenant, &no).await? {
                Some(p) if p.status == PaymentStatus::Processing => Holder::Open(payment_workflow_id(&p.token)),
                Some(p) => Holder::Final(on_final_payment(word, &p)),
                None => Holder::None,
            },
            Err(_) => Holder::None,
        },
        "refund" => refund_holder(store, word).await?,
        _ => Holder::None,
    })
}

/// What holds a refund word's number: a merchant's refund, or the compensation of a payment being cancelled
/// (`{request_no}-refund`), whose payment's workflow applies it.
async fn refund_holder<S: PaymentStore>(store: &S, word: &ChannelWord) -> Result<Holder, sqlx::Error> {
    if let Some(refund_no) = refund_no_of(&word.number) {
        return merchant_refund_holder(store, word, &refund_no).await;
    }
    let Some(no) = word.number.strip_suffix("-refund").and_then(|n| RequestNo::parse(n).ok()) else {
        return Ok(Holder::None);
    };
    let Some(p) = store.payment(&word.tenant, &no).await? else {
        return Ok(Holder::None);
    };
    if p.status == PaymentStatus::Processing {
        return Ok(Holder::Open(payment_workflow_id(&p.token)));
    }
    let asked = RefundRequest {
        merchant_id: String::new(),
        merchant_refund_no: word.number.clone(),
        merchant_request_no: p.request_no.to_string(),
        amount: p.amount,
        notify_url: None,
    };
    Ok(Holder::Final(match refund_of(word) {
        Some(r) if r.matches(&asked) => match (r.status, p.status) {
            // A cancelled payment's charge refunded; a refund that failed leaves the charge kept (succeeded).
            (RefundStatus::Succeeded, PaymentStatus::Failed) | (RefundStatus::Failed, PaymentStatus::Succeeded) => {
                WordOutcome::Agrees
            }
            _ => WordOutcome::Contradicts,
        },
        _ => WordOutcome::NotOurs,
    }))
}

async fn merchant_refund_holder<S: PaymentStore>(
    store: &S,
    word: &ChannelWord,
    refund_no: &RefundNo,
) -> Result<Holder, sqlx::Error> {
    let Some(r) = store.refund(&word.tenant, refund_no).await? else {
        return Ok(Holder::None);
    };
    if r.status == RefundState::Processing {
        return Ok(Holder::Open(refund_workflow_id(&r.token)));
    }
    let asked = RefundRequest {
        merchant_id: String::new(),
        merchant_refund_no: r.merchant_refund_no.clone(),
        merchant_request_no: r.request_no.to_string(),
        amount: r.amount,
        notify_url: None,
    };
    Ok(Holder::Final(match refund_of(word) {
        Some(said) if said.matches(&asked) => match (said.status, r.status) {
            (RefundStatus::Succeeded, RefundState::Succeeded) | (RefundStatus::Failed, RefundState::Failed) => {
                WordOutcome::Agrees
            }
            _ => WordOutcome::Contradicts,
        },
        _ => WordOutcome::NotOurs,
    }))
}

/// What a charge word comes to against a payment that is final: agreeing (succeeded and succeeded; declined and
/// declined or failed: nothing moved), contradicting, or not this payment's charge at all.
fn on_final_payment(word: &ChannelWord, p: &PaymentRecord) -> WordOutcome {
    let asked = ChargeRequest {
        merchant_id: String::new(),
        merchant_request_no: p.request_no.to_string(),
        order_no: p.order_no.to_string(),
        amount: p.amount,
        currency: p.currency.to_string(),
        notify_url: None,
    };
    match charge_of(word) {
        Some(c) if c.matches(&asked) => match (c.status, p.status) {
            (ChargeStatus::Succeeded, PaymentStatus::Succeeded)
            | (ChargeStatus::Declined, PaymentStatus::Declined | PaymentStatus::Failed) => WordOutcome::Agrees,
            _ => WordOutcome::Contradicts,
        },
        _ => WordOutcome::NotOurs,
    }
}

/// Words delivered per pass, at most.
const PASS: i64 = 200;

/// Every `period`, delivers the words not taken up yet that were recorded at least `period` ago (the endpoint
/// delivers a fresh one itself), oldest first: in `serve` and `worker`, until aborted.
pub fn spawn_word_delivery<S: PaymentStore>(engine: Engine<S>, period: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let period_ms = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
        loop {
            tick.tick().await;
            let words = match engine.store().unapplied_words(PASS).await {
                Ok(words) => words,
                Err(e) => {
                    tracing::debug!(error = %e, "could not read the channel's words to deliver");
                    continue;
                }
            };
            let before = engine.now_ms().saturating_sub(period_ms);
            for word in words.iter().filter(|w| w.received_at <= before) {
                if let Err(e) = deliver_word(&engine, word).await {
                    tracing::debug!(error = %e, id = %word.notification_id, "could not deliver the channel's word");
                }
            }
        }
    })
}
