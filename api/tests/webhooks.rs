//! Webhooks (contracts/events.md) through the real application on every backend, against receivers on
//! loopback: the retry schedule (500 three times, then 200: four requests, one id), `410` disables, `429` /
//! `503` honour `Retry-After`, a dead endpoint does not slow a healthy one, signatures verified by the
//! independent `standardwebhooks` package (PyPI) with a rotated secret too, URL refusals (loopback, link-local, a
//! name that resolves to loopback later), tenants, the event log's pages and its expired cursors.

mod common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::webhooks::{Hooked, Receiver, Reply, event, local, start};
use onceflow_api::Auth;
use onceflow_payments::EventSettings;
use onceflow_payments::events::address::{Rules, TableResolver};
use reqwest::Method;
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(20);

macro_rules! on_every_backend {
    ($scenario:ident: $($name:ident => $backend:ident),+ $(,)?) => {
        $( backend_test!($backend, $name, $scenario); )+
    };
}

/// One test of `$scenario` on `$backend`, ignored where its server's URL is not set.
macro_rules! backend_test {
    (sqlite, $name:ident, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let url = common::database("sqlite").await.expect("sqlite always runs");
            $scenario(&url).await;
        }
    };
    (postgres, $name:ident, $scenario:ident) => {
        #[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(url) = common::database("postgres").await else { return };
            $scenario(&url).await;
        }
    };
    (mysql, $name:ident, $scenario:ident) => {
        #[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(url) = common::database("mysql").await else { return };
            $scenario(&url).await;
        }
    };
}

/// Registers an endpoint at `url` (all types unless `events`); its JSON.
async fn endpoint(hooked: &Hooked, url: &str, events: Option<Value>) -> Value {
    let mut body = json!({ "url": url });
    if let Some(events) = events {
        body["events"] = events;
    }
    let a = hooked.app.post("/v1/webhook-endpoints", body).await;
    assert_eq!(a.status, 201, "{}", a.text);
    a.json()
}

/// Retention passes until they have deleted `expected` events in all (the dispatcher must pass an event first,
/// and on Postgres it sees one only once every older write transaction of the server has ended), then one more
/// pass: what they deleted in all.
async fn retained(hooked: &Hooked, expected: u64) -> u64 {
    let started = Instant::now();
    let mut deleted = 0;
    while deleted < expected && started.elapsed() < WITHIN {
        deleted += hooked.retention().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    deleted + hooked.retention().await
}

/// Waits until `GET path` answers a JSON for which `done` holds.
async fn until(hooked: &Hooked, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let a = hooked.app.get(path).await;
        let body = a.json();
        if a.status == 200 && done(&body) {
            return body;
        }
        assert!(started.elapsed() < WITHIN, "{what}: {}", a.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

on_every_backend!(a_receiver_failing_three_times_gets_the_event_four_times_with_one_id:
    retried_sqlite => sqlite, retried_postgres => postgres, retried_mysql => mysql);

async fn a_receiver_failing_three_times_gets_the_event_four_times_with_one_id(url: &str) {
    let receiver = Receiver::start(|_, n| if n < 3 { Reply::Status(500) } else { Reply::Status(200) }).await;
    let hooked = start(url, Auth::SingleTenant, local(&[200, 200, 200, 200, 200])).await;
    let we = endpoint(&hooked, &receiver.url, None).await;
    let e = event("default", "R-1");
    let id = e.id();
    hooked.write(e).await;
    let hits = receiver.wait_for(WITHIN, "four requests", |h| h.len() >= 4).await;
    let detail =
        until(&hooked, &format!("/v1/events/{id}"), "delivered", |b| b["deliveries"][0]["state"] == "delivered").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hits_after = receiver.hits();
    assert_eq!(hits_after.len(), 4, "nothing more once delivered: {hits:?}");
    assert!(hits_after.iter().all(|h| h.id == id), "one id in every request");
    // The schedule: each retry waited its 200 ms (±10 %).
    for pair in hits_after.windows(2) {
        assert!(pair[1].at - pair[0].at >= Duration::from_millis(170), "{:?}", pair[1].at - pair[0].at);
    }
    assert_eq!(detail["deliveries"][0]["attempts"], 4);
    // Every attempt is recorded.
    let page = hooked.app.get(&format!("/v1/webhook-endpoints/{}/deliveries", we["id"].as_str().unwrap())).await;
    let attempts = page.json()["deliveries"].as_array().unwrap().clone();
    let outcomes: Vec<(i64, String, Value)> = attempts
        .iter()
        .map(|a| (a["attempt"].as_i64().unwrap(), a["outcome"].as_str().unwrap().to_owned(), a["status_code"].clone()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (4, "delivered".to_owned(), json!(200)),
            (3, "failed".to_owned(), json!(500)),
            (2, "failed".to_owned(), json!(500)),
            (1, "failed".to_owned(), json!(500)),
        ]
    );
    assert!(attempts[1]["next_attempt_at"].is_string() && attempts[0]["next_attempt_at"].is_null());
    assert!(attempts.iter().all(|a| a["event"] == id && a["latency_ms"].is_i64()));
    let metrics = hooked.app.get("/metrics").await.text;
    for series in [
        "onceflow_webhook_deliveries_total{outcome=\"delivered\"}",
        "onceflow_webhook_deliveries_total{outcome=\"retry\"}",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
}

on_every_backend!(a_receiver_answering_410_is_disabled_and_gets_nothing_more:
    gone_sqlite => sqlite, gone_postgres => postgres, gone_mysql => mysql);

async fn a_receiver_answering_410_is_disabled_and_gets_nothing_more(url: &str) {
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let g = gone.clone();
    let receiver = Receiver::start(move |_, _| {
        if g.load(std::sync::atomic::Ordering::SeqCst) { Reply::Status(410) } else { Reply::Status(200) }
    })
    .await;
    let hooked = start(url, Auth::SingleTenant, local(&[100, 100, 100])).await;
    let we = endpoint(&hooked, &receiver.url, None).await;
    let path = format!("/v1/webhook-endpoints/{}", we["id"].as_str().unwrap());
    let first = event("default", "R-1");
    hooked.write(first.clone()).await;
    receiver.wait_for(WITHIN, "the first request", |h| !h.is_empty()).await;
    let disabled = until(&hooked, &path, "disabled", |b| b["enabled"] == false).await;
    assert_eq!(disabled["disabled_reason"], "gone");
    let detail = hooked.app.get(&format!("/v1/events/{}", first.id())).await.json();
    assert_eq!(detail["deliveries"][0]["state"], "failed", "no retry after 410: {detail}");
    hooked.write(event("default", "R-2")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.hits().len(), 1, "nothing more once disabled");
    // Enabled again by its tenant: the next events are delivered.
    gone.store(false, std::sync::atomic::Ordering::SeqCst);
    let a = hooked.app.send(Method::PATCH, &path, &[], Some(json!({ "enabled": true }))).await;
    assert_eq!((a.status, a.json()["enabled"].clone()), (200, json!(true)), "{}", a.text);
    let third = event("default", "R-3");
    hooked.write(third.clone()).await;
    receiver.wait_for(WITHIN, "the event after enabling", |h| h.iter().any(|h| h.id == third.id())).await;
    assert!(receiver.hits_of(&event("default", "R-2").id()).is_empty(), "the one sent while disabled is not");
}

on_every_backend!(a_429_or_503_is_retried_after_its_retry_after:
    retry_after_sqlite => sqlite, retry_after_postgres => postgres, retry_after_mysql => mysql);

async fn a_429_or_503_is_retried_after_its_retry_after(url: &str) {
    let receiver = Receiver::start(|id, n| match (id.len(), n) {
        (_, 0) => Reply::RetryAfter(429, 2),
        (_, 1) => Reply::RetryAfter(503, 1),
        _ => Reply::Status(204),
    })
    .await;
    let hooked = start(url, Auth::SingleTenant, local(&[50, 50, 50])).await;
    endpoint(&hooked, &receiver.url, None).await;
    hooked.write(event("default", "R-1")).await;
    let hits = receiver.wait_for(WITHIN, "three requests", |h| h.len() >= 3).await;
    let (first, second) = (hits[1].at - hits[0].at, hits[2].at - hits[1].at);
    assert!(first >= Duration::from_millis(1900), "429's Retry-After: 2 s, not the schedule's 50 ms: {first:?}");
    assert!(second >= Duration::from_millis(900), "503's Retry-After: 1 s: {second:?}");
}

on_every_backend!(a_dead_endpoint_does_not_slow_a_healthy_one:
    dead_sqlite => sqlite, dead_postgres => postgres, dead_mysql => mysql);

/// The latency of each of `n` events at the healthy receiver, from its commit to its arrival.
async fn latencies(hooked: &Hooked, healthy: &Receiver, prefix: &str, n: usize) -> Vec<Duration> {
    let mut out = Vec::new();
    for i in 0..n {
        let e = event("default", &format!("{prefix}-{i}"));
        let id = e.id();
        hooked.write(e).await;
        let committed = Instant::now();
        let hits = healthy.wait_for(WITHIN, "the healthy endpoint's request", |h| h.iter().any(|h| h.id == id)).await;
        out.push(hits.iter().find(|h| h.id == id).unwrap().at - committed);
    }
    out.sort();
    out
}

async fn a_dead_endpoint_does_not_slow_a_healthy_one(url: &str) {
    let healthy = Receiver::start(|_, _| Reply::Status(200)).await;
    let dead = Receiver::start(|_, _| Reply::Hang).await;
    let settings = EventSettings { timeout: Duration::from_secs(10), ..local(&[100, 100, 100]) };
    let hooked = start(url, Auth::SingleTenant, settings).await;
    endpoint(&hooked, &healthy.url, None).await;
    let alone = latencies(&hooked, &healthy, "alone", 12).await;
    endpoint(&hooked, &dead.url, None).await;
    let beside = latencies(&hooked, &healthy, "beside", 12).await;
    let dead_hits = dead.hits().len();
    let (p50_alone, p50_beside) = (alone[alone.len() / 2], beside[beside.len() / 2]);
    let (max_alone, max_beside) = (alone[alone.len() - 1], beside[beside.len() - 1]);
    eprintln!(
        "healthy endpoint: p50 {p50_alone:?} / max {max_alone:?} alone, p50 {p50_beside:?} / max {max_beside:?} beside a dead one ({dead_hits} requests hanging there)"
    );
    // Never answered, it is held to its own lane: one attempt at a time.
    assert!(dead_hits >= 1, "the dead endpoint held its lane: {dead_hits}");
    assert!(p50_beside <= p50_alone * 2 + Duration::from_millis(150), "{p50_beside:?} against {p50_alone:?}");
    assert!(max_beside < Duration::from_secs(2), "no healthy delivery waited for the dead one: {max_beside:?}");
}

/// `STANDARDWEBHOOKS_PYTHON`: a Python with the `standardwebhooks` package (PyPI) installed.
fn verifier() -> String {
    std::env::var("STANDARDWEBHOOKS_PYTHON").expect("STANDARDWEBHOOKS_PYTHON: a python with standardwebhooks")
}

/// Whether the standardwebhooks package verifies each of `cases` (`secret`, a request), in one run.
fn verified(cases: &[(&str, &common::webhooks::Hit)]) -> Vec<bool> {
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
for line in sys.stdin:
    case = json.loads(line)
    headers = {"webhook-id": case["id"], "webhook-timestamp": case["timestamp"], "webhook-signature": case["signature"]}
    try:
        payload = Webhook(case["secret"]).verify(case["body"].encode(), headers)
        print("ok" if payload["id"] == case["id"] else "wrong body")
    except Exception as e:
        print("refused: %s" % e)
"#;
    let input: String = cases
        .iter()
        .map(|(secret, hit)| {
            let body = String::from_utf8(hit.body.to_vec()).unwrap();
            json!({ "secret": secret, "id": hit.id, "timestamp": hit.timestamp, "signature": hit.signature, "body": body })
                .to_string()
                + "\n"
        })
        .collect();
    let mut child = std::process::Command::new(verifier())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the standardwebhooks verifier");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    text.lines().map(|l| l == "ok").collect()
}

on_every_backend!(signatures_verify_with_the_standardwebhooks_package_and_a_rotated_secret:
    signed_sqlite => sqlite, signed_postgres => postgres, signed_mysql => mysql);

async fn signatures_verify_with_the_standardwebhooks_package_and_a_rotated_secret(url: &str) {
    if cfg!(onceflow_no_standardwebhooks) {
        eprintln!("skipped: STANDARDWEBHOOKS_PYTHON is not set");
        return;
    }
    let receiver = Receiver::start(|_, _| Reply::Status(200)).await;
    let hooked = start(url, Auth::SingleTenant, local(&[100])).await;
    let we = endpoint(&hooked, &receiver.url, Some(json!(["payment.succeeded"]))).await;
    let old = we["secret"].as_str().unwrap().to_owned();
    assert!(old.starts_with("whsec_"), "{we}");
    let shown = hooked.app.get(&format!("/v1/webhook-endpoints/{}", we["id"].as_str().unwrap())).await;
    assert!(!shown.text.contains("whsec_"), "the secret is shown once: {}", shown.text);
    let first = event("default", "R-1");
    hooked.write(first.clone()).await;
    receiver.wait_for(WITHIN, "the first event", |h| h.len() == 1).await;

    let rotated = hooked
        .app
        .post(&format!("/v1/webhook-endpoints/{}/rotate-secret", we["id"].as_str().unwrap()), json!({}))
        .await;
    assert_eq!(rotated.status, 200, "{}", rotated.text);
    let new = rotated.json()["secret"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    let second = event("default", "R-2");
    hooked.write(second.clone()).await;
    let hits = receiver.wait_for(WITHIN, "the second event", |h| h.len() == 2).await;
    assert_eq!((hits[0].id.as_str(), hits[1].id.as_str()), (first.id().as_str(), second.id().as_str()));
    assert_eq!(hits[1].signature.split(' ').count(), 2, "both signatures during the rotation: {}", hits[1].signature);
    let body: Value = serde_json::from_slice(&hits[1].body).unwrap();
    assert_eq!((body["type"].as_str(), body["tenant"].as_str()), (Some("payment.succeeded"), Some("default")));
    assert_eq!(body["data"]["request_no"], "R-2");

    let stranger = onceflow_payments::events::signing::new_secret();
    let results =
        verified(&[(&old, &hits[0]), (&old, &hits[1]), (&new, &hits[1]), (&new, &hits[0]), (&stranger, &hits[1])]);
    assert_eq!(
        results,
        [true, true, true, false, false],
        "old, old during rotation, new, new before it, another secret"
    );
}

on_every_backend!(urls_are_refused_by_rule_at_registration_and_at_connection:
    refused_sqlite => sqlite, refused_postgres => postgres, refused_mysql => mysql);

async fn urls_are_refused_by_rule_at_registration_and_at_connection(url: &str) {
    let receiver = Receiver::start(|_, _| Reply::Status(200)).await;
    let table = TableResolver::default();
    let public: IpAddr = "93.184.216.34".parse().unwrap();
    table.set("hooks.example", vec![public]);
    table.set("local.example", vec!["127.0.0.1".parse().unwrap()]);
    let strict = EventSettings { resolver: Arc::new(table.clone()), ..local(&[100]) };
    let strict = EventSettings { rules: Rules::default(), ..strict };
    let hooked = start(url, Auth::SingleTenant, strict).await;
    let refused = |a: common::Answer, rule: &str, says: &str| {
        a.assert_problem(422, "webhook_url_refused");
        let detail = a.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(rule) && detail.contains(says), "{detail}");
    };
    let post = |u: String| hooked.app.post("/v1/webhook-endpoints", json!({ "url": u }));
    refused(post(receiver.url.clone()).await, "https_only", "--webhook-allow-http");
    refused(post("https://127.0.0.1:9/hook".into()).await, "public_address_only", "loopback");
    refused(post("https://169.254.169.254/latest/meta-data".into()).await, "public_address_only", "link-local");
    refused(post("https://local.example/hook".into()).await, "public_address_only", "loopback");
    refused(post("https://[::1]/hook".into()).await, "public_address_only", "loopback");
    refused(post("https://nowhere.example/hook".into()).await, "unresolvable", "nowhere.example");

    // Plain http allowed, private addresses not: the link-local address is refused still; a name that resolves
    // to a public address is taken, and when it resolves to loopback later, nothing is sent there. (A database of
    // its own: the first application's deliveries would take this one's, under its stricter rules.)
    let backend = url.split(':').next().unwrap();
    let url = &common::database(backend).await.unwrap();
    let http = EventSettings {
        resolver: Arc::new(table.clone()),
        rules: Rules { allow_http: true, allow_private: false },
        ..local(&[100, 100])
    };
    let hooked = start(url, Auth::SingleTenant, http).await;
    let a = hooked.app.post("/v1/webhook-endpoints", json!({ "url": "http://169.254.169.254/" })).await;
    refused(a, "public_address_only", "link-local");
    let we = endpoint(&hooked, &format!("http://hooks.example:{}/hook", receiver.port), None).await;
    table.set("hooks.example", vec!["127.0.0.1".parse().unwrap()]);
    let e = event("default", "R-1");
    hooked.write(e.clone()).await;
    let attempts = until(
        &hooked,
        &format!("/v1/webhook-endpoints/{}/deliveries", we["id"].as_str().unwrap()),
        "three refused attempts",
        |b| b["deliveries"].as_array().is_some_and(|a| a.len() == 3 && a.iter().all(|x| x["outcome"] == "failed")),
    )
    .await;
    let error = attempts["deliveries"][0]["error"].as_str().unwrap();
    assert!(error.contains("loopback"), "{error}");
    assert!(receiver.hits().is_empty(), "nothing reached the receiver behind the loopback address");
}

on_every_backend!(tenants_see_only_their_own_and_operators_every_tenants:
    tenants_sqlite => sqlite, tenants_postgres => postgres, tenants_mysql => mysql);

async fn tenants_see_only_their_own_and_operators_every_tenants(url: &str) {
    let receiver = Receiver::start(|_, _| Reply::Status(200)).await;
    let auth = Auth::keys(vec![("acme".into(), "acme-key-123".into()), ("globex".into(), "globex-key-123".into())])
        .with_operators(vec![("ops".into(), "operator-key-1".into())]);
    let hooked = start(url, auth, local(&[100])).await;
    let as_key = |key: &str| common::App {
        base: hooked.app.base.clone(),
        client: reqwest::Client::new(),
        key: Some(key.into()),
    };
    let (acme, globex, ops) = (as_key("acme-key-123"), as_key("globex-key-123"), as_key("operator-key-1"));
    let created = acme.post("/v1/webhook-endpoints", json!({ "url": receiver.url })).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let we = created.json()["id"].as_str().unwrap().to_owned();
    ops.post("/v1/webhook-endpoints", json!({ "url": receiver.url })).await.assert_problem(403, "forbidden");
    let e = event("acme", "R-1");
    hooked.write(e.clone()).await;
    receiver.wait_for(WITHIN, "acme's event", |h| h.len() == 1).await;
    let id = e.id();
    for path in [
        format!("/v1/webhook-endpoints/{we}"),
        format!("/v1/webhook-endpoints/{we}/deliveries"),
        format!("/v1/events/{id}"),
    ] {
        assert_eq!(acme.get(&path).await.status, 200, "{path}");
        let other = globex.get(&path).await;
        assert_eq!(other.status, 404, "another tenant's: {path} {}", other.text);
        assert_eq!(ops.get(&path).await.status, 200, "an operator reads every tenant's: {path}");
    }
    let a =
        globex.send(Method::PATCH, &format!("/v1/webhook-endpoints/{we}"), &[], Some(json!({"enabled": false}))).await;
    a.assert_problem(404, "endpoint_not_found");
    globex.post(&format!("/v1/events/{id}/redeliver"), json!({})).await.assert_problem(404, "event_not_found");
    assert_eq!(globex.get("/v1/events").await.json()["events"], json!([]));
    globex.get("/v1/events?tenant=acme").await.assert_problem(403, "forbidden");
    assert_eq!(globex.get("/v1/webhook-endpoints").await.json()["endpoints"], json!([]));
    assert_eq!(acme.get("/v1/events").await.json()["events"][0]["id"], id);
    assert_eq!(ops.get("/v1/events?tenant=acme").await.json()["events"][0]["id"], id);
    assert_eq!(ops.get("/v1/events?tenant=globex").await.json()["events"], json!([]));
    // Redelivery: the same id again, by its tenant or an operator.
    let again = acme.post(&format!("/v1/events/{id}/redeliver"), json!({ "endpoint": we })).await;
    assert_eq!(again.status, 202, "{}", again.text);
    // No body (every endpoint subscribed), still asked for as JSON.
    let json_ct = [("content-type", "application/json")];
    let by_ops = ops.send(Method::POST, &format!("/v1/events/{id}/redeliver"), &json_ct, None).await;
    assert_eq!(by_ops.status, 202, "{}", by_ops.text);
    let hits = receiver.wait_for(WITHIN, "two redeliveries", |h| h.len() == 3).await;
    assert!(hits.iter().all(|h| h.id == id));
}

on_every_backend!(the_log_pages_in_commit_order_and_an_expired_cursor_is_410:
    log_sqlite => sqlite, log_postgres => postgres, log_mysql => mysql);

async fn the_log_pages_in_commit_order_and_an_expired_cursor_is_410(url: &str) {
    let day = 24 * 3600 * 1000;
    let settings = EventSettings { retention: Duration::from_secs(24 * 3600), ..local(&[100]) };
    let hooked = start(url, Auth::SingleTenant, settings).await;
    let now = chrono::Utc::now().timestamp_millis();
    let mut written = Vec::new();
    for i in 0..25 {
        let mut e = event("default", &format!("R-{i}"));
        if i < 5 {
            e.created_at = now - 3 * day;
        }
        if i % 2 == 1 {
            e.kind = onceflow_payments::EventType::PaymentFailed;
        }
        written.push(e.id());
        hooked.write(e).await;
    }
    // On Postgres the log shows an event once every older write transaction of the server has ended.
    until(&hooked, "/v1/events?limit=1000", "every event in the log", |b| b["events"].as_array().unwrap().len() == 25)
        .await;
    let mut seen = Vec::new();
    let mut cursors = Vec::new();
    let mut path = "/v1/events?limit=10".to_owned();
    loop {
        let page = hooked.app.get(&path).await;
        assert_eq!(page.status, 200, "{}", page.text);
        let body = page.json();
        let events = body["events"].as_array().unwrap();
        let cursor = body["next_cursor"].as_str().expect("always a cursor").to_owned();
        cursors.push(cursor.clone());
        if events.is_empty() {
            break;
        }
        seen.extend(events.iter().map(|e| e["id"].as_str().unwrap().to_owned()));
        path = format!("/v1/events?limit=10&after={cursor}");
    }
    assert_eq!(seen, written, "every event once, in commit order");
    let failed = hooked.app.get("/v1/events?type=payment.failed&limit=100").await.json();
    assert_eq!(failed["events"].as_array().unwrap().len(), 12);
    hooked.app.get("/v1/events?type=payment.nope").await.assert_problem(400, "invalid_request");
    hooked.app.get("/v1/events?after=12x").await.assert_problem(400, "invalid_request");

    // A cursor taken after the second event: once retention deleted the five old ones, it is expired.
    let after_second = hooked.app.get("/v1/events?limit=2").await.json()["next_cursor"].as_str().unwrap().to_owned();
    // Retention deletes only what the dispatcher has passed: passes until it has.
    assert_eq!(retained(&hooked, 5).await, 5);
    hooked.app.get(&format!("/v1/events?after={after_second}")).await.assert_problem(410, "cursor_expired");
    let from_start = hooked.app.get("/v1/events?limit=100").await.json();
    assert_eq!(from_start["events"].as_array().unwrap().len(), 20);
    assert_eq!(from_start["events"][0]["id"], written[5]);
    // The last page's cursor is still good: nothing after it was deleted.
    let last = cursors.last().unwrap();
    assert_eq!(hooked.app.get(&format!("/v1/events?after={last}")).await.status, 200);
    hooked.app.get(&format!("/v1/events/{}", written[0])).await.assert_problem(404, "event_not_found");
}

/// The receiver of `docs/events.md` (the Python block after `<!-- receiver -->`), run as written with the secret and port
/// filled in: it verifies a real delivery and prints the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(onceflow_no_standardwebhooks, ignore = "STANDARDWEBHOOKS_PYTHON is not set")]
async fn the_events_page_receiver_verifies_an_event() {
    use std::io::BufRead;
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/events.md")).unwrap();
    let block = readme.split("<!-- receiver -->\n```python\n").nth(1).expect("the receiver block");
    let block = block.split("```").next().unwrap();
    let url = common::database("sqlite").await.unwrap();
    // Python may take a moment to listen: retries a while.
    let hooked = start(&url, Auth::SingleTenant, local(&[500, 1000, 2000, 4000])).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let we = endpoint(&hooked, &format!("http://127.0.0.1:{port}/"), None).await;
    let script = block
        .replace("whsec_…", we["secret"].as_str().unwrap())
        .replace("(\"127.0.0.1\", 9000)", &format!("(\"127.0.0.1\", {port})"));
    assert!(script.contains(&port.to_string()), "the block listens on 9000: {block}");
    let mut python = std::process::Command::new(verifier())
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = python.stdout.take().unwrap();
    let e = event("default", "R-readme");
    hooked.write(e.clone()).await;
    let line = tokio::task::spawn_blocking(move || std::io::BufReader::new(stdout).lines().next()).await.unwrap();
    // The receiver answers after it printed: stopped only once the delivery is recorded.
    let detail =
        until(&hooked, &format!("/v1/events/{}", e.id()), "delivered", |b| b["deliveries"][0]["state"] == "delivered")
            .await;
    let _ = python.kill();
    let _ = python.wait();
    assert_eq!(line.unwrap().unwrap(), format!("{} payment.succeeded R-readme", e.id()));
    assert_eq!(detail["deliveries"][0]["last_status"], 204);
}

on_every_backend!(an_event_with_a_delivery_pending_outlives_its_retention:
    kept_sqlite => sqlite, kept_postgres => postgres, kept_mysql => mysql);

async fn an_event_with_a_delivery_pending_outlives_its_retention(url: &str) {
    let receiver = Receiver::start(|_, _| Reply::Status(500)).await;
    let settings = EventSettings { retention: Duration::from_secs(24 * 3600), ..local(&[60_000]) };
    let hooked = start(url, Auth::SingleTenant, settings).await;
    let we = endpoint(&hooked, &receiver.url, None).await;
    let we = we["id"].as_str().unwrap().to_owned();
    let three_days_ago = chrono::Utc::now().timestamp_millis() - 3 * 24 * 3600 * 1000;
    let (mut held, mut free) = (event("default", "R-held"), event("default", "R-free"));
    held.created_at = three_days_ago;
    free.created_at = three_days_ago;
    let (held_id, free_id) = (held.id(), free.id());
    hooked.write(held).await;
    hooked.write(free).await;
    // Older than the endpoint: not dispatched to it; sent there by a redelivery, which fails and waits a minute.
    let a = hooked.app.post(&format!("/v1/events/{held_id}/redeliver"), json!({ "endpoint": we })).await;
    assert_eq!(a.status, 202, "{}", a.text);
    let path = format!("/v1/events/{held_id}");
    until(&hooked, &path, "a failed attempt", |b| b["deliveries"][0]["attempts"] == 1).await;
    assert_eq!(hooked.app.get(&path).await.json()["deliveries"][0]["state"], "pending");
    assert_eq!(retained(&hooked, 1).await, 1, "the old event with nothing pending goes, the held one stays");
    hooked.app.get(&format!("/v1/events/{free_id}")).await.assert_problem(404, "event_not_found");
    assert_eq!(hooked.app.get(&path).await.status, 200);
    // Deleting the endpoint fails its pending delivery; then nothing holds the event.
    let a = hooked.app.send(Method::DELETE, &format!("/v1/webhook-endpoints/{we}"), &[], None).await;
    assert_eq!(a.status, 204, "{}", a.text);
    let failed = hooked.app.get(&path).await.json();
    assert_eq!(failed["deliveries"][0]["state"], "failed", "{failed}");
    assert_eq!(failed["deliveries"][0]["last_error"], "the endpoint was deleted");
    assert_eq!(retained(&hooked, 1).await, 1);
    hooked.app.get(&path).await.assert_problem(404, "event_not_found");
}
