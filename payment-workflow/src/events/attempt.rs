//! One claimed attempt: sent (signed, within the timeout, what is read back capped) only while its lease has
//! room for it, and its outcome recorded under the claim.

use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_engine::Engine;

use super::address::{Guard, literal};
use super::model::{AttemptOutcome, AttemptResult, Claimed};
use super::settings::{EventSettings, retry_wait};
use super::signing::signature_header;
use super::slots::{Permit, Slots};
use super::store::EventStore;
use crate::settings::millis;

/// The most of an endpoint's answer that is read (then the connection is dropped).
const READ_CAP: usize = 64 * 1024;

/// The HTTP client of deliveries: every name resolved through the guard, no redirects (a redirect could lead
/// anywhere), no proxy from the environment (it would connect for us, past the guard), the timeout.
pub(crate) fn client(settings: &EventSettings) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .dns_resolver(Arc::new(Guard { resolver: settings.resolver.clone(), rules: settings.rules }))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout)
        .user_agent("onceflow-webhooks/1")
        .pool_max_idle_per_host(settings.per_endpoint)
        .build()
}

/// A number in [0, 1), for jitter.
fn unit() -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let x = (uuid::Uuid::new_v4().as_u128() >> 75) as f64;
    x / (1u64 << 53) as f64
}

/// Whether an attempt whose lease ends at `deadline` may still be sent at `now`: the whole attempt (at most
/// `timeout`) must end within the lease, or another process could claim the delivery again and send it at the
/// same time.
fn room_for(deadline: Instant, now: Instant, timeout: Duration) -> bool {
    deadline.saturating_duration_since(now) >= timeout
}

/// What the delivery loop hands one attempt.
pub(crate) struct Job<S: EventStore> {
    pub(crate) engine: Engine<S>,
    pub(crate) client: reqwest::Client,
    pub(crate) settings: Arc<EventSettings>,
    pub(crate) slots: Slots,
    /// When the claim's lease ends, measured from before the claim was asked for (so never later than the
    /// database's).
    pub(crate) deadline: Instant,
}

/// Sends one claimed attempt and records how it ended; `_permit` is its slot until then.
pub(crate) async fn attempt<S: EventStore>(job: Job<S>, c: Claimed, _permit: Permit) {
    let Job { engine, client, settings, slots, deadline } = job;
    let store = engine.store();
    if !room_for(deadline, Instant::now(), settings.timeout) {
        tracing::warn!(delivery = %c.delivery.id, "not sent: too little of its claim's lease is left; due again now");
        if let Err(e) = store.give_back(&c, engine.now_ms()).await {
            tracing::warn!(error = %e, delivery = %c.delivery.id, "could not give a claim back; its lease expires");
        }
        return;
    }
    let started = Instant::now();
    let sent = tokio::time::timeout(settings.timeout, send(&client, &settings, &c)).await;
    let latency_ms = millis(started.elapsed());
    let finished_at = engine.now_ms();
    let (status, error, retry_after) = match sent {
        Ok(Ok((status, retry_after))) => (Some(status), None, retry_after),
        Ok(Err(e)) => (None, Some(e), None),
        Err(_) => (None, Some(format!("no answer within {:?}", settings.timeout)), None),
    };
    let ok = status.is_some_and(|s| (200..300).contains(&s));
    let gone = status == Some(410);
    let error = match (status, error) {
        (_, Some(e)) => Some(e),
        (Some(s), None) if !ok => Some(format!("answered {s}")),
        _ => None,
    };
    let retry_in = if ok || gone {
        None
    } else {
        retry_wait(&c.delivery.schedule, c.delivery.attempts, unit(), retry_after).map(millis)
    };
    slots.record(&c.delivery.endpoint_id, ok);
    let outcome = if ok { AttemptOutcome::Delivered } else { AttemptOutcome::Failed };
    let label = match (ok, gone, retry_in) {
        (true, _, _) => "delivered",
        (_, true, _) => "gone",
        (_, _, Some(_)) => "retry",
        _ => "failed",
    };
    metrics::counter!("onceflow_webhook_deliveries_total", "outcome" => label).increment(1);
    let result = AttemptResult { outcome, status_code: status, error, latency_ms, finished_at, retry_in, gone };
    match store.finish(&c, &result).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(delivery = %c.delivery.id, "the delivery's claim was lost; its attempt is recorded")
        }
        // The lease expires and the delivery is sent again: at least once, never lost.
        Err(e) => tracing::warn!(error = %e, delivery = %c.delivery.id, "could not record an attempt"),
    }
}

/// The `POST`: its status and `Retry-After` (on `429`, `503`), or why there was none.
async fn send(
    client: &reqwest::Client,
    settings: &EventSettings,
    c: &Claimed,
) -> Result<(i32, Option<Duration>), String> {
    // Checked again at every attempt: the flags may have changed since registration. A name is checked where
    // it is resolved, by the client's resolver.
    let url = settings.rules.check_shape(&c.url).map_err(|e| format!("refused: {e}"))?;
    if let Some(address) = url.host_str().and_then(literal) {
        settings
            .rules
            .check_address(url.host_str().unwrap_or_default(), address)
            .map_err(|e| format!("refused: {e}"))?;
    }
    let event = c.event();
    let body = serde_json::to_vec(&event.body()).map_err(|e| e.to_string())?;
    let now = chrono::Utc::now();
    let timestamp = now.timestamp();
    let secrets = c.signing_secrets(now.timestamp_millis());
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &event.id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature_header(&secrets, &event.id, timestamp, &body));
    if let Some(traceparent) = &event.traceparent {
        request = request.header("traceparent", traceparent);
    }
    let mut response = request.body(body).send().await.map_err(|e| describe(&e))?;
    let status = i32::from(response.status().as_u16());
    let retry_after = if matches!(status, 429 | 503) {
        response.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(retry_after)
    } else {
        None
    };
    // Read what it answers, up to the cap: a connection is reused only once its answer is read, and an endpoint
    // that streams for ever is cut off.
    let mut read = 0;
    while let Ok(Some(chunk)) = response.chunk().await {
        read += chunk.len();
        if read >= READ_CAP {
            break;
        }
    }
    Ok((status, retry_after))
}

/// A request error, said without the URL (it is the endpoint's, shown beside).
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "could not connect".to_owned()
    } else {
        "the request failed".to_owned()
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A `Retry-After` value: seconds, or an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    if let Ok(seconds) = value.trim().parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value.trim()).ok()?;
    let wait = at.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    Some(Duration::from_millis(u64::try_from(wait).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        assert_eq!(retry_after("soon"), None);
        let u = unit();
        assert!((0.0..1.0).contains(&u));
    }

    #[test]
    fn an_attempt_is_sent_only_with_its_timeout_left_in_the_lease() {
        let now = Instant::now();
        let timeout = Duration::from_secs(15);
        assert!(room_for(now + Duration::from_secs(20), now, timeout));
        assert!(room_for(now + timeout, now, timeout));
        assert!(!room_for(now + Duration::from_secs(14), now, timeout), "it could outlive its lease");
        assert!(!room_for(now, now + Duration::from_secs(1), timeout), "the lease has passed");
    }
}
