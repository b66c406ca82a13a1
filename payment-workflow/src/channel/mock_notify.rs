//! The mock channel's notifications (`contracts/channel.md`, Notifications): once a charge or refund with a
//! `notify_url` is final, its notification is `POST`ed there, signed afresh for each attempt, until an attempt
//! is answered `2xx` or the schedule runs out.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Notification;

/// The contract's waits between a notification's attempts: 15 s, 1 min, 5 min, 30 min, 2 h, 6 h, then every
/// 6 h while the attempts stay within 24 h of the first.
pub const DEFAULT_NOTIFY_SCHEDULE: [Duration; 8] = [
    Duration::from_secs(15),
    Duration::from_secs(60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(6 * 3600),
    Duration::from_secs(6 * 3600),
    Duration::from_secs(6 * 3600),
];

/// How long one attempt may take before it counts as failed.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// A notification owed once its charge or refund settles.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    url: String,
    pub(crate) merchant_id: String,
    settles_at: Instant,
    body: Vec<u8>,
}

impl Pending {
    /// The notification of `what` (`charge.succeeded`, …) whose channel id is `id`, due at `settles_at`, with
    /// `data` as a query would answer once settled.
    pub(crate) fn new(
        url: String,
        id: &str,
        what: &str,
        merchant_id: &str,
        settles_at: Instant,
        data: &impl Serialize,
    ) -> Self {
        let after = settles_at.saturating_duration_since(Instant::now());
        let created = chrono::Utc::now() + chrono::Duration::from_std(after).unwrap_or_default();
        let notification = Notification {
            id: format!("ntf_{id}"),
            kind: what.to_owned(),
            created_at: created.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            merchant_id: merchant_id.to_owned(),
            data: serde_json::to_value(data).unwrap_or_default(),
        };
        let body = serde_json::to_vec(&notification).unwrap_or_default();
        Self { url, merchant_id: merchant_id.to_owned(), settles_at, body }
    }
}

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).build().unwrap_or_default())
}

/// Sends `pending` once it is due, then again after each wait of `schedule` until one attempt is answered
/// `2xx`; each attempt signed with every one of `secrets` at its own time.
pub(crate) async fn deliver(pending: Pending, secrets: Vec<String>, schedule: Vec<Duration>, sent: Arc<AtomicU64>) {
    tokio::time::sleep_until(pending.settles_at.into()).await;
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    let mut waits = schedule.into_iter();
    loop {
        let t = chrono::Utc::now().timestamp();
        let signature = super::signature::header(&secrets, t, &pending.body);
        sent.fetch_add(1, Ordering::Relaxed);
        let answer = client()
            .post(&pending.url)
            .header("content-type", "application/json")
            .header("channel-signature", signature)
            .body(pending.body.clone())
            .send()
            .await;
        match answer {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => {
                tracing::debug!(url = %pending.url, status = %r.status(), "notification refused; sent again later")
            }
            Err(e) => tracing::debug!(url = %pending.url, error = %e, "notification not delivered; sent again later"),
        }
        let Some(wait) = waits.next() else {
            tracing::warn!(url = %pending.url, "notification given up: its schedule ran out");
            return;
        };
        tokio::time::sleep(wait).await;
    }
}
