//! The delivery loop, run by `serve` and `worker`: the dispatcher turns committed events into deliveries, then
//! due deliveries are claimed per endpoint — at most [`EventSettings::per_endpoint`] in flight to one endpoint,
//! so a slow or dead endpoint holds only its own slots — and each attempt is sent in a task of its own, signed,
//! within the timeout, with what it reads back capped; its outcome is recorded under the claim.
//!
//! A claim leases the delivery for longer than an attempt can take ([`EventSettings::lease`]), so no two
//! processes send one attempt at once; a process that dies mid-attempt leaves its lease to expire, and the
//! delivery is sent again — with the same `webhook-id` — by whichever process claims it next.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onceflow_engine::Engine;
use tokio::task::JoinSet;

use super::address::{Guard, literal};
use super::model::{AttemptOutcome, AttemptResult, Claimed};
use super::settings::{EventSettings, wait_after};
use super::signing::signature_header;
use crate::store::PaymentStore;

/// Events the dispatcher takes per transaction.
const DISPATCH_BATCH: i64 = 500;

/// Attempts in flight at once in one process, over every endpoint.
const IN_FLIGHT: usize = 256;

/// The most of an endpoint's answer that is read (then the connection is dropped).
const READ_CAP: usize = 64 * 1024;

/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

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

/// Runs the dispatcher and the deliveries until aborted (`serve`, `worker`).
pub(crate) async fn run<S: PaymentStore>(engine: Engine<S>, settings: Arc<EventSettings>) {
    let client = match client(&settings) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "webhook deliveries cannot start: no HTTP client");
            return;
        }
    };
    let in_flight: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let mut tasks = JoinSet::new();
    let schedule = settings.stored_schedule();
    let lease = i64::try_from(settings.lease().as_millis()).unwrap_or(i64::MAX);
    let mut gauges_at = Instant::now();
    loop {
        let store = engine.store();
        // Dispatch everything committed since the last pass, a batch per transaction.
        loop {
            match store.dispatch(DISPATCH_BATCH, engine.now_ms(), &schedule).await {
                Ok(n) if n == DISPATCH_BATCH as u64 => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "event dispatch failed; the next pass tries again");
                    break;
                }
            }
        }
        while tasks.try_join_next().is_some() {}
        let now = engine.now_ms();
        match store.due_endpoints(now).await {
            Ok(endpoints) => {
                for endpoint in endpoints {
                    let busy = in_flight.lock().map(|m| m.get(&endpoint).copied().unwrap_or(0)).unwrap_or(usize::MAX);
                    let free = settings.per_endpoint.saturating_sub(busy).min(IN_FLIGHT.saturating_sub(tasks.len()));
                    if free == 0 {
                        continue;
                    }
                    let claimed = match store.claim(&endpoint, free as i64, now, now.saturating_add(lease)).await {
                        Ok(claimed) => claimed,
                        Err(e) => {
                            tracing::warn!(error = %e, endpoint, "could not claim deliveries");
                            continue;
                        }
                    };
                    for c in claimed {
                        if let Ok(mut m) = in_flight.lock() {
                            *m.entry(endpoint.clone()).or_default() += 1;
                        }
                        let (engine, client, in_flight, settings) =
                            (engine.clone(), client.clone(), in_flight.clone(), settings.clone());
                        tasks.spawn(async move {
                            let endpoint = c.delivery.endpoint_id.clone();
                            attempt(&engine, &client, &settings, c).await;
                            if let Ok(mut m) = in_flight.lock()
                                && let Some(n) = m.get_mut(&endpoint)
                            {
                                *n -= 1;
                                if *n == 0 {
                                    m.remove(&endpoint);
                                }
                            }
                        });
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not look for due deliveries"),
        }
        if gauges_at.elapsed() >= Duration::from_secs(5) {
            gauges_at = Instant::now();
            if let Ok((count, oldest)) = store.pending().await {
                #[allow(clippy::cast_precision_loss)]
                {
                    metrics::gauge!("onceflow_webhook_pending").set(count as f64);
                    let age = oldest.map_or(0, |created| (engine.now_ms() - created).max(0));
                    metrics::gauge!("onceflow_webhook_oldest_pending_seconds").set(age as f64 / 1000.0);
                }
            }
        }
        tokio::time::sleep(settings.poll).await;
    }
}

/// Sends one claimed attempt and records how it ended.
async fn attempt<S: PaymentStore>(engine: &Engine<S>, client: &reqwest::Client, settings: &EventSettings, c: Claimed) {
    let started = Instant::now();
    let sent = tokio::time::timeout(settings.timeout, send(client, settings, &c)).await;
    let latency_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
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
    let next_attempt_at = if ok || gone {
        None
    } else {
        wait_after(&c.delivery.schedule, c.delivery.attempts, unit()).map(|wait| {
            let wait = retry_after.map_or(wait, |r| r.min(MAX_RETRY_AFTER));
            finished_at.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX))
        })
    };
    let outcome = if ok { AttemptOutcome::Delivered } else { AttemptOutcome::Failed };
    let label = match (ok, gone, next_attempt_at) {
        (true, _, _) => "delivered",
        (_, true, _) => "gone",
        (_, _, Some(_)) => "retry",
        _ => "failed",
    };
    metrics::counter!("onceflow_webhook_deliveries_total", "outcome" => label).increment(1);
    let result = AttemptResult { outcome, status_code: status, error, latency_ms, finished_at, next_attempt_at, gone };
    match engine.store().finish(&c, &result).await {
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
    let timestamp = chrono::Utc::now().timestamp();
    let endpoint_secrets = {
        let mut s = vec![c.secret.as_str()];
        if let (Some(previous), Some(until)) = (&c.previous_secret, c.previous_until)
            && until > chrono::Utc::now().timestamp_millis()
        {
            s.push(previous);
        }
        s
    };
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &event.id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature_header(&endpoint_secrets, &event.id, timestamp, &body));
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
}
