//! Webhooks under what goes wrong (issue 32's review), through the real application on every backend: many dead
//! endpoints beside healthy ones, a delivery whose event or endpoint went away, retention racing a redelivery,
//! cursors after retention, an endpoint disabled with deliveries pending, a `Retry-After` shorter than the
//! schedule, a process whose clock is wrong, concurrent changes to one endpoint, and clients sending ids and
//! tenants no database can store.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::App;
use common::webhooks::{Hooked, Receiver, Reply, count, event, local, sql, start, start_skewed};
use onceflow_api::Auth;
use onceflow_payments::EventSettings;
use onceflow_payments::events::address::{Rules, TableResolver};
use reqwest::Method;
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(20);
const DAY: i64 = 24 * 3600 * 1000;

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

/// Registers an endpoint at `url` as `app`'s caller: its id and secret.
async fn register(app: &App, url: &str) -> (String, String) {
    let a = app.post("/v1/webhook-endpoints", json!({ "url": url })).await;
    assert_eq!(a.status, 201, "{}", a.text);
    let body = a.json();
    (body["id"].as_str().unwrap().to_owned(), body["secret"].as_str().unwrap().to_owned())
}

/// Waits until `GET path` answers a JSON for which `done` holds.
async fn until(app: &App, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let a = app.get(path).await;
        let body = a.json();
        if a.status == 200 && done(&body) {
            return body;
        }
        assert!(started.elapsed() < WITHIN, "{what}: {}", a.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `query` counts `expected` on the application's database.
async fn until_count(hooked: &Hooked, query: &str, expected: i64) {
    let started = Instant::now();
    loop {
        let n = count(&hooked.url, query).await;
        if n == expected {
            return;
        }
        assert!(started.elapsed() < WITHIN, "{query}: {n}, not {expected}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Retention passes until they have deleted `expected` events in all (the dispatcher must pass an event first),
/// then one more: what they deleted in all.
async fn retained(hooked: &Hooked, expected: u64) -> u64 {
    let started = Instant::now();
    let mut deleted = 0;
    while deleted < expected && started.elapsed() < WITHIN {
        deleted += hooked.retention().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    deleted + hooked.retention().await
}

/// An event of `tenant` created `age_ms` ago.
fn old_event(tenant: &str, request_no: &str, age_ms: i64) -> onceflow_payments::NewEvent {
    let mut e = event(tenant, request_no);
    e.created_at -= age_ms;
    e
}

on_every_backend!(many_dead_endpoints_of_one_tenant_starve_no_one:
    starve_sqlite => sqlite, starve_postgres => postgres, starve_mysql => mysql);

/// 64 endpoints of one tenant that never answer, each with deliveries due, beside a healthy endpoint of the same
/// tenant and one of another tenant: a new event reaches both healthy ones at once.
async fn many_dead_endpoints_of_one_tenant_starve_no_one(url: &str) {
    let dead = Receiver::start(|_, _| Reply::Hang).await;
    let healthy = Receiver::start(|_, _| Reply::Status(200)).await;
    let auth = Auth::keys(vec![("bad".into(), "bad-key-123".into()), ("good".into(), "good-key-123".into())]);
    let settings = EventSettings { timeout: Duration::from_secs(10), ..local(&[100, 100, 100]) };
    let hooked = start(url, auth, settings).await;
    let (bad, good) = (hooked.as_key("bad-key-123"), hooked.as_key("good-key-123"));
    for i in 0..64 {
        register(&bad, &format!("{}?n={i}", dead.url)).await;
    }
    register(&bad, &healthy.url).await;
    register(&good, &healthy.url).await;
    for i in 0..3 {
        hooked.write(event("bad", &format!("S-{i}"))).await;
    }
    // Every dead endpoint holds an attempt (hanging) before the probes are written.
    dead.wait_for(WITHIN, "the dead endpoints' first requests", |h| h.len() >= 64).await;
    let (own, other) = (event("bad", "probe"), event("good", "probe"));
    hooked.write(own.clone()).await;
    hooked.write(other.clone()).await;
    let committed = Instant::now();
    for probe in [&own, &other] {
        let id = probe.id();
        let hits = healthy.wait_for(Duration::from_secs(30), "a probe", |h| h.iter().any(|h| h.id == id)).await;
        let latency = hits.iter().find(|h| h.id == id).unwrap().at.saturating_duration_since(committed);
        eprintln!("{}'s healthy endpoint beside 64 dead ones: {latency:?} ({} dead requests)", probe.tenant, {
            dead.hits().len()
        });
        assert!(latency < Duration::from_secs(2), "{}'s healthy endpoint waited {latency:?}", probe.tenant);
    }
}

on_every_backend!(a_delivery_whose_event_is_gone_fails_and_its_endpoint_goes_on:
    orphan_sqlite => sqlite, orphan_postgres => postgres, orphan_mysql => mysql);

/// A pending delivery whose event row is gone (what retention racing a redelivery used to leave) is failed
/// when claimed, and the endpoint's other deliveries go on.
async fn a_delivery_whose_event_is_gone_fails_and_its_endpoint_goes_on(url: &str) {
    // Its first attempt fails; the event is gone before the second.
    let receiver = Receiver::start(|_, n| if n == 0 { Reply::Status(500) } else { Reply::Status(200) }).await;
    let hooked = start(url, Auth::SingleTenant, local(&[300, 300, 300, 300])).await;
    register(&hooked.app, &receiver.url).await;
    let gone = event("default", "R-gone");
    let gone_id = gone.id();
    hooked.write(gone).await;
    receiver.wait_for(WITHIN, "the first attempt", |h| !h.is_empty()).await;
    sql(url, &format!("DELETE FROM events WHERE id = '{gone_id}'")).await;
    // The orphan is due before the next event.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let next = event("default", "R-next");
    hooked.write(next.clone()).await;
    receiver.wait_for(WITHIN, "the next event", |h| h.iter().any(|h| h.id == next.id())).await;
    let of = |state: &str| {
        format!("SELECT count(*) FROM webhook_deliveries WHERE event_id = '{gone_id}' AND state = '{state}'")
    };
    until_count(&hooked, &of("failed"), 1).await;
    assert_eq!(count(url, &of("pending")).await, 0);
}

on_every_backend!(deleting_endpoints_while_their_events_dispatch_leaves_nothing_pending:
    race_delete_sqlite => sqlite, race_delete_postgres => postgres, race_delete_mysql => mysql);

/// An endpoint deleted while the dispatcher makes its deliveries: none of them is left pending.
async fn deleting_endpoints_while_their_events_dispatch_leaves_nothing_pending(url: &str) {
    let receiver = Receiver::start(|_, _| Reply::Status(500)).await;
    let hooked = start(url, Auth::SingleTenant, local(&[60_000])).await;
    for round in 0..8 {
        let (we, _) = register(&hooked.app, &receiver.url).await;
        // One transaction: one dispatcher batch of 300 deliveries to the endpoint.
        hooked.write_all((0..300).map(|i| event("default", &format!("R-{round}-{i}"))).collect()).await;
        tokio::time::sleep(Duration::from_millis(round * 15)).await;
        let a = hooked.app.send(Method::DELETE, &format!("/v1/webhook-endpoints/{we}"), &[], None).await;
        assert_eq!(a.status, 204, "{}", a.text);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pending = count(url, "SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'").await;
    assert_eq!(pending, 0, "deliveries to deleted endpoints left pending");
}

on_every_backend!(a_cursor_the_log_hands_out_is_never_expired_at_once:
    cursor_sqlite => sqlite, cursor_postgres => postgres, cursor_mysql => mysql);

/// After retention: the first page (no cursor), a small page, a type that matches nothing, an emptied log —
/// each `next_cursor` reads again without `410`.
async fn a_cursor_the_log_hands_out_is_never_expired_at_once(url: &str) {
    let receiver = Receiver::start(|_, _| Reply::Status(500)).await;
    let settings = EventSettings { retention: Duration::from_secs(24 * 3600), ..local(&[60_000]) };
    let hooked = start(url, Auth::SingleTenant, settings).await;
    let app = &hooked.app;
    let (we, _) = register(app, &receiver.url).await;
    // K is kept past its retention by a pending redelivery; D1, D2 go.
    let (k, d1, d2) =
        (old_event("default", "K", 3 * DAY), old_event("default", "D1", 3 * DAY), old_event("default", "D2", 3 * DAY));
    let kid = k.id();
    for e in [k, d1, d2] {
        hooked.write(e).await;
    }
    until(app, "/v1/events?limit=1000", "three events in the log", |b| b["events"].as_array().unwrap().len() == 3)
        .await;
    let a = app.post(&format!("/v1/events/{kid}/redeliver"), json!({ "endpoint": we })).await;
    assert_eq!(a.status, 202, "{}", a.text);
    until(app, &format!("/v1/events/{kid}"), "K's failed attempt", |b| b["deliveries"][0]["attempts"] == 1).await;
    assert_eq!(retained(&hooked, 2).await, 2, "D1 and D2 go, K stays");

    let follow = |cursor: String, filter: &'static str| async move {
        let again = app.get(&format!("/v1/events?after={cursor}{filter}")).await;
        assert_eq!(again.status, 200, "the cursor {cursor} just handed out: {}", again.text);
    };
    for path in ["/v1/events", "/v1/events?limit=1"] {
        let page = app.get(path).await;
        assert_eq!(page.status, 200, "{}", page.text);
        follow(page.json()["next_cursor"].as_str().unwrap().to_owned(), "").await;
    }
    let none = app.get("/v1/events?type=refund.failed").await.json();
    assert_eq!(none["events"], json!([]));
    follow(none["next_cursor"].as_str().unwrap().to_owned(), "&type=refund.failed").await;

    // Nothing holds K any more: retention empties the log.
    let a = app.send(Method::DELETE, &format!("/v1/webhook-endpoints/{we}"), &[], None).await;
    assert_eq!(a.status, 204, "{}", a.text);
    assert_eq!(retained(&hooked, 1).await, 1);
    let empty = app.get("/v1/events").await.json();
    assert_eq!(empty["events"], json!([]));
    let cursor = empty["next_cursor"].as_str().unwrap().to_owned();
    follow(cursor.clone(), "").await;
    // And the next event comes after it.
    let next = event("default", "N");
    hooked.write(next.clone()).await;
    until(app, &format!("/v1/events?after={cursor}"), "the next event after the cursor", |b| {
        b["events"].as_array().unwrap().iter().any(|e| e["id"] == next.id())
    })
    .await;
}

on_every_backend!(disabling_an_endpoint_fails_its_pending_deliveries:
    disable_sqlite => sqlite, disable_postgres => postgres, disable_mysql => mysql);

/// `PATCH {"enabled": false}` fails what is pending to the endpoint (as a `410` or a delete does); enabling it
/// again sends none of it.
async fn disabling_an_endpoint_fails_its_pending_deliveries(url: &str) {
    let receiver = Receiver::start(|_, _| Reply::Status(500)).await;
    let hooked = start(url, Auth::SingleTenant, local(&[60_000])).await;
    let app = &hooked.app;
    let (we, _) = register(app, &receiver.url).await;
    let e = event("default", "R-1");
    hooked.write(e.clone()).await;
    let path = format!("/v1/events/{}", e.id());
    until(app, &path, "a failed attempt", |b| b["deliveries"][0]["attempts"] == 1).await;
    let endpoint = format!("/v1/webhook-endpoints/{we}");
    let a = app.send(Method::PATCH, &endpoint, &[], Some(json!({ "enabled": false }))).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let detail = app.get(&path).await.json();
    assert_eq!(detail["deliveries"][0]["state"], "failed", "{detail}");
    assert!(detail["deliveries"][0]["last_error"].as_str().unwrap().contains("disabled"), "{detail}");
    let a = app.send(Method::PATCH, &endpoint, &[], Some(json!({ "enabled": true }))).await;
    assert_eq!(a.status, 200, "{}", a.text);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(receiver.hits().len(), 1, "nothing stale is sent on enabling");
}

on_every_backend!(a_retry_after_shorter_than_the_schedule_waits_the_schedule:
    short_retry_after_sqlite => sqlite, short_retry_after_postgres => postgres, short_retry_after_mysql => mysql);

/// `503 Retry-After: 0` and `429 Retry-After: 1` against a schedule of 1.5 s: each retry waits the schedule.
async fn a_retry_after_shorter_than_the_schedule_waits_the_schedule(url: &str) {
    let receiver = Receiver::start(|_, n| match n {
        0 => Reply::RetryAfter(503, 0),
        1 => Reply::RetryAfter(429, 1),
        _ => Reply::Status(204),
    })
    .await;
    let hooked = start(url, Auth::SingleTenant, local(&[1500, 1500, 1500])).await;
    register(&hooked.app, &receiver.url).await;
    hooked.write(event("default", "R-1")).await;
    let hits = receiver.wait_for(WITHIN, "three requests", |h| h.len() >= 3).await;
    for pair in hits.windows(2) {
        let waited = pair[1].at - pair[0].at;
        assert!(waited >= Duration::from_millis(1350), "a short Retry-After cut the schedule's 1.5 s: {waited:?}");
    }
}

on_every_backend!(a_process_whose_clock_is_slow_keeps_its_lease:
    skew_sqlite => sqlite, skew_postgres => postgres, skew_mysql => mysql);

/// A process whose clock is a minute slow claims an attempt that takes 3 s; a second process (right clock) on
/// the same database starts meanwhile: it does not send the same attempt beside the first.
async fn a_process_whose_clock_is_slow_keeps_its_lease(url: &str) {
    let receiver =
        Receiver::start(|_, n| if n == 0 { Reply::Slow(Duration::from_secs(3)) } else { Reply::Status(200) }).await;
    let settings = || EventSettings { timeout: Duration::from_secs(5), ..local(&[100]) };
    let slow = start_skewed(url, Auth::SingleTenant, settings(), -60_000).await;
    register(&slow.app, &receiver.url).await;
    let e = event("default", "R-1");
    slow.write(e.clone()).await;
    receiver.wait_for(WITHIN, "the first request", |h| !h.is_empty()).await;
    let right = start(url, Auth::SingleTenant, settings()).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(receiver.overlap.load(Ordering::SeqCst), 1, "one attempt sent twice at once");
    let detail = until(&right.app, &format!("/v1/events/{}", e.id()), "delivered", |b| {
        b["deliveries"][0]["state"] == "delivered"
    })
    .await;
    assert_eq!((detail["deliveries"][0]["attempts"].as_i64(), receiver.hits().len()), (Some(1), 1), "{detail}");
}

on_every_backend!(patch_and_rotate_change_only_what_they_name:
    concurrent_sqlite => sqlite, concurrent_postgres => postgres, concurrent_mysql => mysql);

/// A `PATCH` of the URL and a rotation of the secret at the same time, twenty times: each keeps what the other
/// changed.
async fn patch_and_rotate_change_only_what_they_name(url: &str) {
    let receiver = Receiver::start(|_, _| Reply::Status(200)).await;
    let hooked = start(url, Auth::SingleTenant, local(&[100])).await;
    let app = &hooked.app;
    let (we, _) = register(app, &receiver.url).await;
    let path = format!("/v1/webhook-endpoints/{we}");
    let (mut secret, rotate_path) = (String::new(), format!("{path}/rotate-secret"));
    for i in 0..20 {
        let moved = format!("{}?v={i}", receiver.url);
        let patch = app.send(Method::PATCH, &path, &[], Some(json!({ "url": moved })));
        let rotate = app.post(&rotate_path, json!({}));
        let (p, r) = tokio::join!(patch, rotate);
        assert_eq!((p.status, r.status), (200, 200), "{} {}", p.text, r.text);
        secret = r.json()["secret"].as_str().unwrap().to_owned();
        assert_eq!(app.get(&path).await.json()["url"], moved, "round {i}: the rotation undid the PATCH");
        let kept = format!("SELECT count(*) FROM webhook_endpoints WHERE id = '{we}' AND secret = '{secret}'");
        assert_eq!(count(url, &kept).await, 1, "round {i}: the PATCH undid the rotation");
    }
    let e = event("default", "R-1");
    hooked.write(e.clone()).await;
    let hits = receiver.wait_for(WITHIN, "the event", |h| !h.is_empty()).await;
    let timestamp: i64 = hits[0].timestamp.parse().unwrap();
    let signed = onceflow_payments::events::signing::sign(&secret, &e.id(), timestamp, &hits[0].body).unwrap();
    assert!(hits[0].signature.split(' ').any(|s| s == signed), "signed with the last rotation's secret");
}

on_every_backend!(a_patch_racing_a_410_does_not_enable_the_endpoint_again:
    patch_gone_sqlite => sqlite, patch_gone_postgres => postgres, patch_gone_mysql => mysql);

/// `PATCH`es of the subscriptions, back to back, while the endpoint answers `410`: it stays disabled.
async fn a_patch_racing_a_410_does_not_enable_the_endpoint_again(url: &str) {
    let receiver = Receiver::start(|_, _| Reply::Status(410)).await;
    let hooked = Arc::new(start(url, Auth::SingleTenant, local(&[100])).await);
    for round in 0..5 {
        let (we, _) = register(&hooked.app, &receiver.url).await;
        let path = format!("/v1/webhook-endpoints/{we}");
        let stop = Arc::new(AtomicBool::new(false));
        let mut patches = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let (hooked, path, stop) = (hooked.clone(), path.clone(), stop.clone());
            patches.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let a = hooked.app.send(Method::PATCH, &path, &[], Some(json!({ "events": null }))).await;
                    assert_eq!(a.status, 200, "{}", a.text);
                }
            });
        }
        let e = event("default", &format!("R-{round}"));
        hooked.write(e.clone()).await;
        receiver.wait_for(WITHIN, "the 410", |h| h.iter().any(|h| h.id == e.id())).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::SeqCst);
        while let Some(done) = patches.join_next().await {
            done.unwrap();
        }
        let endpoint = hooked.app.get(&path).await.json();
        assert_eq!((endpoint["enabled"].clone(), endpoint["disabled_reason"].clone()), (json!(false), json!("gone")));
    }
}

on_every_backend!(ids_and_tenants_no_database_can_store_are_client_mistakes:
    nul_sqlite => sqlite, nul_postgres => postgres, nul_mysql => mysql);

/// NUL bytes and ids this API never gives, in paths, `?tenant=` and a redelivery's body: `404` for an id, `400`
/// for a tenant, never `503`.
async fn ids_and_tenants_no_database_can_store_are_client_mistakes(url: &str) {
    let hooked = start(url, Auth::SingleTenant, local(&[100])).await;
    let app = &hooked.app;
    for (method, path, code) in [
        (Method::GET, "/v1/events/evt_%00", "event_not_found"),
        (Method::GET, "/v1/events/evt_0000000000000000000000000%00", "event_not_found"),
        (Method::GET, "/v1/events/nope", "event_not_found"),
        (Method::POST, "/v1/events/evt_%00/redeliver", "event_not_found"),
        (Method::GET, "/v1/webhook-endpoints/we_%00", "endpoint_not_found"),
        (Method::GET, "/v1/webhook-endpoints/we_%00/deliveries", "endpoint_not_found"),
        (Method::DELETE, "/v1/webhook-endpoints/we_%00", "endpoint_not_found"),
        (Method::POST, "/v1/webhook-endpoints/we_%00/rotate-secret", "endpoint_not_found"),
    ] {
        app.send(method.clone(), path, &[], None).await.assert_problem(404, code);
    }
    let a = app.send(Method::PATCH, "/v1/webhook-endpoints/we_%00", &[], Some(json!({ "enabled": true }))).await;
    a.assert_problem(404, "endpoint_not_found");
    let e = event("default", "R-1");
    hooked.write(e.clone()).await;
    let a = app.post(&format!("/v1/events/{}/redeliver", e.id()), json!({ "endpoint": "we_\u{0}" })).await;
    a.assert_problem(404, "endpoint_not_found");
    for path in ["/v1/events?tenant=a%00b", "/v1/webhook-endpoints?tenant=%00"] {
        app.get(path).await.assert_problem(400, "invalid_request");
    }
}

/// Special addresses written as IPv6 transition forms are refused, and no refusal says which address a name
/// resolved to (not backend-dependent: SQLite only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transition_addresses_are_refused_and_no_refusal_says_where_a_name_resolves() {
    let url = common::database("sqlite").await.unwrap();
    let table = TableResolver::default();
    table.set("inside.example", vec!["10.1.2.3".parse().unwrap()]);
    table.set("hooks.example", vec!["93.184.216.34".parse().unwrap()]);
    let rules = Rules { allow_http: true, allow_private: false };
    let settings = EventSettings { resolver: Arc::new(table.clone()), rules, ..local(&[100, 100]) };
    let hooked = start(&url, Auth::SingleTenant, settings).await;
    let app = &hooked.app;
    for literal in [
        "[64:ff9b:1::a00:1]", // NAT64, local use
        "[64:ff9b::a00:1]",   // NAT64 of 10.0.0.1
        "[2002:a00:1::1]",    // 6to4 of 10.0.0.1
        "[2001::1]",          // Teredo
        "[100::1]",           // discard-only
    ] {
        let a = app.post("/v1/webhook-endpoints", json!({ "url": format!("https://{literal}/hook") })).await;
        a.assert_problem(422, "webhook_url_refused");
    }
    let a = app.post("/v1/webhook-endpoints", json!({ "url": "https://inside.example/hook" })).await;
    a.assert_problem(422, "webhook_url_refused");
    assert!(!a.text.contains("10.1.2.3"), "the refusal says where the name resolves: {}", a.text);
    // Registered while public, private when the delivery connects: the attempt's error does not say where.
    let (we, _) = register(app, "http://hooks.example/hook").await;
    table.set("hooks.example", vec!["10.9.8.7".parse().unwrap()]);
    hooked.write(event("default", "R-1")).await;
    let attempts = until(app, &format!("/v1/webhook-endpoints/{we}/deliveries"), "a refused attempt", |b| {
        b["deliveries"].as_array().is_some_and(|a| !a.is_empty() && a[0]["outcome"] == "failed")
    })
    .await;
    let error = attempts["deliveries"][0]["error"].as_str().unwrap();
    assert!(error.contains("private") && !error.contains("10.9.8.7"), "{error}");
}

/// The OpenAPI document's id patterns are the ones the service checks ids with (an id of another shape is a
/// `404` without a look in the database).
#[test]
fn the_documented_id_patterns_are_the_services() {
    use onceflow_payments::events::{ENDPOINT_ID_PATTERN, EVENT_ID_PATTERN};
    use utoipa::OpenApi;
    let doc = serde_json::to_value(onceflow_api::ApiDoc::openapi()).unwrap();
    let pattern = |path: &str, method: &str| {
        let parameters = doc["paths"][path][method]["parameters"].as_array().unwrap_or_else(|| panic!("{path}"));
        parameters.iter().find(|p| p["in"] == "path").unwrap()["schema"]["pattern"].clone()
    };
    for (path, method) in [("/v1/events/{event_id}", "get"), ("/v1/events/{event_id}/redeliver", "post")] {
        assert_eq!(pattern(path, method), EVENT_ID_PATTERN, "{method} {path}");
    }
    for (path, method) in [
        ("/v1/webhook-endpoints/{endpoint_id}", "get"),
        ("/v1/webhook-endpoints/{endpoint_id}", "patch"),
        ("/v1/webhook-endpoints/{endpoint_id}", "delete"),
        ("/v1/webhook-endpoints/{endpoint_id}/rotate-secret", "post"),
        ("/v1/webhook-endpoints/{endpoint_id}/deliveries", "get"),
    ] {
        assert_eq!(pattern(path, method), ENDPOINT_ID_PATTERN, "{method} {path}");
    }
}
