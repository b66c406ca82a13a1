//! Notifications in (`contracts/http-api.md`, Channel notifications): the channel's signed word that a charge
//! or refund reached a final status. A notification is taken only when its signature verifies against the
//! secret of the merchant it names and its time is within 5 minutes; then it is recorded once by its id,
//! durably, before it is acknowledged. Anything unverifiable is refused alike and leaves nothing behind.
//!
//! What is recorded is then delivered (`deliver.rs`): the workflow holding the number is woken and its attempt
//! applies it through the same checks as a channel answer (`word.rs`); a word on a final status, or on a number
//! onceflow does not hold, is marked so and kept as evidence (an exception for operators when it contradicts).

mod accounts;
mod deliver;
mod word;

pub use accounts::ChannelAccounts;
pub use deliver::{Delivered, deliver_word, spawn_word_delivery};
pub use word::WordOutcome;
pub(crate) use word::{Words, word_on_charge, word_on_refund};

use crate::channel::Notification;
use crate::channel::signature::Signature;
use crate::store::{ChannelWord, ChannelWordStore};

/// What came of a verified notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// Recorded now: the word, to deliver.
    Recorded(Box<ChannelWord>),
    /// Its id was recorded before: nothing changed.
    Duplicate,
}

/// Why a notification was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTaken {
    /// No signature, a bad one, a stale `t`, an unknown merchant or one without a secret: all the same to the
    /// sender (`401 notification_unverified`), said here only for the log.
    Unverified(&'static str),
    /// Verified, but not a notification of the protocol (`400 invalid_request`).
    Invalid(&'static str),
}

fn counted(outcome: &'static str) {
    metrics::counter!("onceflow_channel_notifications_total", "outcome" => outcome).increment(1);
}

/// Verifies `body` against its `Channel-Signature` header and, if it holds, records it (see the module). The
/// tenant is the one whose merchant id the body names. `now_ms`: the receiver's clock.
pub async fn take_notification<S: ChannelWordStore>(
    store: &S,
    accounts: &ChannelAccounts,
    signature: Option<&str>,
    body: &[u8],
    now_ms: i64,
) -> Result<Result<Taken, NotTaken>, sqlx::Error> {
    let verified = verify(accounts, signature, body, now_ms);
    let (tenant, notification) = match verified {
        Ok(verified) => verified,
        Err(refused) => {
            counted(match refused {
                NotTaken::Unverified(_) => "unverified",
                NotTaken::Invalid(_) => "invalid",
            });
            return Ok(Err(refused));
        }
    };
    let Some((kind, number, status, amount)) = notification.entry() else {
        counted("invalid");
        return Ok(Err(NotTaken::Invalid("not a charge or refund notification of the protocol")));
    };
    let word = ChannelWord {
        merchant_id: notification.merchant_id.clone(),
        notification_id: notification.id.clone(),
        source: "notification".into(),
        tenant,
        kind: kind.as_str().into(),
        number,
        status,
        amount,
        body: String::from_utf8_lossy(body).into_owned(),
        received_at: now_ms,
        applied_at: None,
        outcome: None,
    };
    if !store.record_word(&word).await? {
        counted("duplicate");
        return Ok(Ok(Taken::Duplicate));
    }
    counted("recorded");
    tracing::info!(tenant = %word.tenant, kind = %word.kind, number = %word.number, status = %word.status,
        id = %word.notification_id, "channel notification recorded");
    Ok(Ok(Taken::Recorded(Box::new(word))))
}

/// The tenant and the notification, if `body` is signed by its merchant's secret at a time within the
/// tolerance. The merchant is read from the body before the signature is checked (it says whose secret to
/// check with); nothing else of it is trusted until then.
fn verify(
    accounts: &ChannelAccounts,
    signature: Option<&str>,
    body: &[u8],
    now_ms: i64,
) -> Result<(String, Notification), NotTaken> {
    #[derive(serde::Deserialize)]
    struct Named {
        merchant_id: String,
    }
    let signature = signature.and_then(Signature::parse).ok_or(NotTaken::Unverified("no signature"))?;
    let named: Named = serde_json::from_slice(body).map_err(|_| NotTaken::Unverified("no merchant named"))?;
    let secrets = accounts.secrets_of(&named.merchant_id);
    let tenant = accounts.tenant_of(&named.merchant_id).ok_or(NotTaken::Unverified("no tenant has this merchant"))?;
    if secrets.is_empty() {
        return Err(NotTaken::Unverified("no secret for this merchant"));
    }
    if !signature.verifies(&secrets, body, now_ms.div_euclid(1000)) {
        return Err(NotTaken::Unverified("the signature does not verify, or its time is out of tolerance"));
    }
    let notification: Notification =
        serde_json::from_slice(body).map_err(|_| NotTaken::Invalid("not a notification"))?;
    Ok((tenant.to_owned(), notification))
}
