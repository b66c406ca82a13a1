//! The channel's word as an answer: what the words recorded on a charge's or refund's number (notifications,
//! a statement's settlements) say to the payment or refund asking, through the same checks as a channel answer
//! ([`Charge::matches`], [`Refund::matches`]: merchant, number, order, amount, currency), and each word marked
//! taken up with what came of it.
//!
//! A word is read whether or not it was taken up before: an attempt that took a word as its answer and was
//! stopped before its outcome committed finds the same word, and the same answer, the next time.

use crate::channel::{Charge, ChargeRequest, Refund, RefundRequest};
use crate::store::{ChannelWord, ChannelWordStore};

/// What came of a word, as its `outcome` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordOutcome {
    /// It settled the payment or refund holding its number (applied by its workflow).
    Settled,
    /// It informed the compensation of a payment being cancelled (a charge it says succeeded is refunded; the
    /// payment never succeeds by it).
    Informed,
    /// The payment or refund had already reached the same final status.
    Agrees,
    /// It contradicts a final status: nothing changed; an exception for operators.
    Contradicts,
    /// Its data is not the payment's or refund's holding the number (another amount, order, currency or
    /// merchant): never applied; an exception for operators.
    NotOurs,
    /// onceflow holds no payment or refund under its number: kept as evidence for reconciliation.
    Unheld,
    /// The workflow holding its number ended without settling it (`compensation_failed`): left for an operator,
    /// whose retry of the workflow reads it like any word on its number.
    ForOperator,
}

impl WordOutcome {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Settled => "settled",
            Self::Informed => "informed_compensation",
            Self::Agrees => "agrees",
            Self::Contradicts => "contradicts",
            Self::NotOurs => "not_ours",
            Self::Unheld => "unheld",
            Self::ForOperator => "operator",
        }
    }
}

/// The charge or refund a word reports, as a query would answer it: a notification's `data` (its merchant, when
/// it names one, must be the notification's own, whose secret signed it), or a statement's line. `None` when it
/// is not one. The merchant is then left out of the checks: the word's tenant is the one whose merchant signed
/// it (or whose statement held it), and only that tenant's numbers are looked for.
fn reported(word: &ChannelWord) -> Option<serde_json::Value> {
    let body: serde_json::Value = serde_json::from_str(&word.body).ok()?;
    let mut data = match word.source.as_str() {
        "notification" => body.get("data")?.clone(),
        _ => body,
    };
    let object = data.as_object_mut()?;
    if object.get("merchant_id").and_then(serde_json::Value::as_str).is_some_and(|m| m != word.merchant_id) {
        return None;
    }
    object.remove("merchant_id");
    // The status the word reports (a notification's type, the line's status): the data's own, when it says, was
    // checked to be the same when the word was taken.
    object.insert("status".into(), serde_json::Value::String(word.status.clone()));
    Some(data)
}

/// The charge `word` reports, if it is one.
pub(crate) fn charge_of(word: &ChannelWord) -> Option<Charge> {
    (word.kind == "charge").then(|| reported(word)).flatten().and_then(|d| serde_json::from_value(d).ok())
}

/// The refund `word` reports, if it is one.
pub(crate) fn refund_of(word: &ChannelWord) -> Option<Refund> {
    (word.kind == "refund").then(|| reported(word)).flatten().and_then(|d| serde_json::from_value(d).ok())
}

/// Where a workflow's attempts read the channel's word on their number: its tenant's words in `store`.
pub(crate) struct Words<'a, S> {
    /// The words' store.
    pub(crate) store: &'a S,
    /// The workflow's tenant: only its words are read.
    pub(crate) tenant: &'a str,
}

/// The channel's word on one number, as an answer: what it reports, and the words that say so.
#[derive(Debug, Clone)]
pub(crate) struct Word<T> {
    /// The charge or refund reported (a final status).
    pub(crate) answer: T,
    words: Vec<ChannelWord>,
}

impl<T> Word<T> {
    /// Marks the words that said so taken up as `outcome` (those not taken up before).
    pub(crate) async fn mark<S: ChannelWordStore>(&self, store: &S, outcome: WordOutcome) {
        mark_all(store, &self.words, outcome).await;
    }
}

/// Marks `words` taken up as `outcome`, each once; a failure is logged (the word stays to be delivered, and is
/// taken up again).
pub(crate) async fn mark_all<S: ChannelWordStore>(store: &S, words: &[ChannelWord], outcome: WordOutcome) {
    let now = chrono::Utc::now().timestamp_millis();
    for w in words.iter().filter(|w| w.applied_at.is_none()) {
        if let Err(e) = store.mark_word(&w.merchant_id, &w.notification_id, outcome.as_str(), now).await {
            tracing::warn!(error = %e, id = %w.notification_id, "could not mark the channel's word taken up");
        }
    }
}

/// What the words on `tenant`'s `kind` `number` say, given how each is read (`read`) and checked against what
/// was asked (`ours`): the answer the matching words agree on. Words that are not ours are marked so (and
/// logged); matching words that disagree on the status settle nothing (marked contradicting, logged: the
/// channel is asked as before).
async fn word_on<S: ChannelWordStore, T: Clone + std::fmt::Debug>(
    store: &S,
    tenant: &str,
    kind: &str,
    number: &str,
    read: impl Fn(&ChannelWord) -> Option<T>,
    ours: impl Fn(&T) -> bool,
    status: impl Fn(&T) -> String,
) -> Option<Word<T>> {
    let words = match store.words_on(tenant, kind, number).await {
        Ok(words) => words,
        Err(e) => {
            tracing::warn!(error = %e, %tenant, kind, number, "could not read the channel's word: the channel is asked");
            return None;
        }
    };
    let mut matching: Vec<(ChannelWord, T)> = Vec::new();
    let mut not_ours = Vec::new();
    for w in words {
        match read(&w) {
            Some(answer) if ours(&answer) => matching.push((w, answer)),
            _ => {
                if w.applied_at.is_none() {
                    tracing::warn!(%tenant, kind, number, id = %w.notification_id, source = %w.source,
                        "the channel's word on this number is not this one's (merchant, order, amount or currency differ): not applied");
                }
                not_ours.push(w);
            }
        }
    }
    mark_all(store, &not_ours, WordOutcome::NotOurs).await;
    let (_, first) = matching.first()?;
    let first = first.clone();
    let words: Vec<ChannelWord> = matching.iter().map(|(w, _)| w.clone()).collect();
    if matching.iter().any(|(_, a)| status(a) != status(&first)) {
        tracing::warn!(%tenant, kind, number, "the channel's words on this number disagree: none applied, the channel is asked");
        mark_all(store, &words, WordOutcome::Contradicts).await;
        return None;
    }
    Some(Word { answer: first, words })
}

/// The channel's word on `request`'s charge, for `tenant`: a charge that [`Charge::matches`] it.
pub(crate) async fn word_on_charge<S: ChannelWordStore>(
    store: &S,
    tenant: &str,
    request: &ChargeRequest,
) -> Option<Word<Charge>> {
    let ours = |c: &Charge| c.matches(request);
    let status = |c: &Charge| format!("{:?}", c.status);
    word_on(store, tenant, "charge", &request.merchant_request_no, charge_of, ours, status).await
}

/// The channel's word on `request`'s refund, for `tenant`: a refund that [`Refund::matches`] it.
pub(crate) async fn word_on_refund<S: ChannelWordStore>(
    store: &S,
    tenant: &str,
    request: &RefundRequest,
) -> Option<Word<Refund>> {
    let ours = |r: &Refund| r.matches(request);
    let status = |r: &Refund| format!("{:?}", r.status);
    word_on(store, tenant, "refund", &request.merchant_refund_no, refund_of, ours, status).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::ChargeStatus;

    fn word(source: &str, body: serde_json::Value) -> ChannelWord {
        ChannelWord {
            merchant_id: "acme".into(),
            notification_id: "ntf_1".into(),
            source: source.into(),
            tenant: "acme".into(),
            kind: "charge".into(),
            number: "R-1".into(),
            status: "succeeded".into(),
            amount: 1000,
            body: body.to_string(),
            received_at: 0,
            applied_at: None,
            outcome: None,
        }
    }

    #[test]
    fn a_notification_and_a_statement_line_read_as_the_charge_they_report() {
        let request = ChargeRequest {
            merchant_id: "tenant-name".into(),
            merchant_request_no: "R-1".into(),
            order_no: "O-1".into(),
            amount: 1000,
            currency: "CNY".into(),
            notify_url: None,
        };
        let data = serde_json::json!({"merchant_id": "acme", "merchant_request_no": "R-1", "charge_id": "c1",
            "amount": 1000, "currency": "CNY", "order_no": "O-1"});
        let notified = charge_of(&word("notification", serde_json::json!({"id": "ntf_1", "data": data}))).unwrap();
        assert_eq!(notified.status, ChargeStatus::Succeeded, "the status is the word's");
        assert!(notified.matches(&request), "the merchant was checked against the signer's, then left out");
        let line = serde_json::json!({"kind": "charge", "merchant_request_no": "R-1", "charge_id": "c1",
            "order_no": "O-1", "amount": 1000, "currency": "CNY", "status": "succeeded", "settled_at": "x"});
        assert!(charge_of(&word("statement", line)).unwrap().matches(&request));

        let foreign = serde_json::json!({"data": {"merchant_id": "globex", "merchant_request_no": "R-1",
            "charge_id": "c1", "amount": 1000, "currency": "CNY"}});
        assert!(charge_of(&word("notification", foreign)).is_none(), "data of another merchant than the signer");
        let other = serde_json::json!({"data": {"merchant_request_no": "R-1", "charge_id": "c1", "amount": 999,
            "currency": "CNY"}});
        assert!(!charge_of(&word("notification", other)).unwrap().matches(&request), "another amount");
    }
}
