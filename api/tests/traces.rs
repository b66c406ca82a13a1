//! Traces end to end (issue 33), with real `onceflow serve` processes exporting over OTLP/HTTP to a receiver of
//! the test's own (a small axum server decoding the protobuf bodies), and a channel process that records the
//! `traceparent` of each request; a traced payment's event carries its trace to the merchant's endpoint.

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::post;
use common::channel::TestChannel;
use common::webhooks::{Receiver, Reply};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::json;
use tokio::process::{Child, Command};

const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");

/// A span as the receiver got it: trace id (hex), name, attributes as text.
#[derive(Debug, Clone)]
struct Got {
    trace_id: String,
    name: String,
    attributes: Vec<(String, String)>,
}

impl Got {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// An OTLP/HTTP receiver on a loopback port: its base URL and what it got.
async fn receiver() -> (String, Arc<Mutex<Vec<Got>>>) {
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                let mut spans = sink.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        for span in scope.spans {
                            let attributes = span
                                .attributes
                                .iter()
                                .map(|a| {
                                    let value = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                                        Some(AnyValue::StringValue(s)) => s.clone(),
                                        Some(AnyValue::IntValue(i)) => i.to_string(),
                                        Some(other) => format!("{other:?}"),
                                        None => String::new(),
                                    };
                                    (a.key.clone(), value)
                                })
                                .collect();
                            let trace_id = span.trace_id.iter().map(|b| format!("{b:02x}")).collect();
                            spans.push(Got { trace_id, name: span.name, attributes });
                        }
                    }
                }
                ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, app).into_future());
    (base, got)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `onceflow serve` on `db` over `channel`, exporting traces to `otlp`; waits for `/healthz`.
async fn serve(db: &str, channel: &str, otlp: &str) -> (Child, String) {
    serve_with(db, channel, otlp, &[]).await
}

/// [`serve`] with the flags `extra` too.
async fn serve_with(db: &str, channel: &str, otlp: &str, extra: &[&str]) -> (Child, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let child = Command::new(ONCEFLOW)
        .args(["serve", "--listen", &listen, "--database-url", db, "--channel-url", channel])
        .args(["--otlp-endpoint", otlp, "--lease-ms", "1000", "--channel-timeout-ms", "20000"])
        .args(extra)
        // Batches leave at once, so a process killed a moment later has sent what it did so far.
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://{listen}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if reqwest::get(format!("{base}/healthz")).await.is_ok_and(|r| r.status().is_success()) {
            return (child, base);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("serve did not start");
}

async fn pay(client: &reqwest::Client, base: &str, order_no: &str, traceparent: &str, wait: u32) -> serde_json::Value {
    let order = json!({"order_no": order_no, "amount": 1000, "currency": "CNY"});
    client.post(format!("{base}/v1/orders")).json(&order).send().await.unwrap();
    let token: serde_json::Value = client.post(format!("{base}/v1/tokens")).send().await.unwrap().json().await.unwrap();
    let answer = client
        .post(format!("{base}/v1/payments"))
        .header("idempotency-key", token["token"].as_str().unwrap())
        .header("traceparent", traceparent)
        .header("prefer", format!("wait={wait}"))
        .json(&order)
        .send()
        .await
        .unwrap();
    answer.json().await.unwrap()
}

/// Waits until the receiver holds spans of `trace_id` for which `done` holds (up to 15 s).
async fn spans_of(got: &Mutex<Vec<Got>>, trace_id: &str, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let spans: Vec<Got> = got.lock().unwrap().iter().filter(|s| s.trace_id == trace_id).cloned().collect();
        if done(&spans) || Instant::now() > deadline {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// One trace from the request through the workflow's steps to the channel call; the channel sees its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_request_to_the_channel() {
    let (otlp, got) = receiver().await;
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let db = common::database("sqlite").await.unwrap();
    let (mut serve, base) = serve(&db, &channel.url, &otlp).await;
    let client = reqwest::Client::new();
    let paid = pay(&client, &base, "O-1", &format!("00-{TRACE}-00f067aa0ba902b7-01"), 10).await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    let request_no = paid["request_no"].as_str().unwrap().to_owned();
    // The request's span ends after its answer is sent: it may come in an export after the steps'.
    let wanted = ["request", "workflow run", "payment", "step"];
    let spans = spans_of(&got, TRACE, |s| {
        s.iter().any(|s| s.attribute("step_key") == Some("call_channel"))
            && wanted.iter().all(|w| s.iter().any(|s| s.name == *w))
    })
    .await;
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    for wanted in wanted {
        assert!(names.contains(&wanted), "no {wanted} span in the trace: {names:?}");
    }
    let payment = spans.iter().find(|s| s.name == "payment").unwrap();
    assert_eq!(payment.attribute("request_no"), Some(request_no.as_str()));
    assert_eq!(payment.attribute("tenant"), Some("default"));
    assert!(spans.iter().any(|s| s.attribute("workflow_id").is_some_and(|w| w.starts_with("pay:"))));
    let seen = channel.traceparents();
    assert!(!seen.is_empty() && seen.iter().all(|tp| tp.contains(TRACE)), "the channel saw {seen:?}");
    serve.kill().await.unwrap();
}

/// A traced payment's event carries the payment's trace to the merchant's endpoint (`traceparent`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_payments_event_carries_its_trace_to_the_endpoint() {
    const EVENTS: &str = "5cf92f3577b34da6a3ce929d0e0e4737";
    let (otlp, _got) = receiver().await;
    let channel = TestChannel::serve(Duration::ZERO, false).await;
    let hook = Receiver::start(|_, _| Reply::Status(200)).await;
    let db = common::database("sqlite").await.unwrap();
    let local = ["--webhook-allow-http", "--webhook-allow-private"];
    let (mut serve, base) = serve_with(&db, &channel.url, &otlp, &local).await;
    let client = reqwest::Client::new();
    let endpoint = client.post(format!("{base}/v1/webhook-endpoints")).json(&json!({"url": hook.url})).send();
    assert_eq!(endpoint.await.unwrap().status(), 201);
    let paid = pay(&client, &base, "O-1", &format!("00-{EVENTS}-00f067aa0ba902b7-01"), 10).await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    let hits = hook.wait_for(Duration::from_secs(20), "the payment's event", |h| !h.is_empty()).await;
    let event: serde_json::Value = serde_json::from_slice(&hits[0].body).unwrap();
    assert_eq!(
        (event["type"].as_str(), &event["data"]["request_no"]),
        (Some("payment.succeeded"), &paid["request_no"])
    );
    assert!(hits[0].traceparent.contains(EVENTS), "the delivery's traceparent: {:?}", hits[0].traceparent);
    serve.kill().await.unwrap();
}

/// A payment killed mid-charge and resumed by another process continues the same trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_resumed_by_another_process_continues_its_trace() {
    const RESUMED: &str = "0af7651916cd43dd8448eb211c80319c";
    let (otlp, got) = receiver().await;
    let channel = TestChannel::serve(Duration::from_secs(3), false).await;
    let db = common::database("sqlite").await.unwrap();
    let (mut first, base) = serve(&db, &channel.url, &otlp).await;
    let client = reqwest::Client::new();
    let started = pay(&client, &base, "O-1", &format!("00-{RESUMED}-b7ad6b7169203331-01"), 0).await;
    assert_eq!(started["status"], "processing", "{started}");
    // Killed while the channel holds the charge.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!channel.traceparents().is_empty(), "the charge left before the kill");
    first.kill().await.unwrap();
    first.wait().await.unwrap();
    let before = got.lock().unwrap().len();
    // Another process resumes it once the lease has expired.
    let (mut second, _) = serve(&db, &channel.url, &otlp).await;
    let spans = spans_of(&got, RESUMED, |s| {
        s.len() > before
            && s.iter().any(|s| {
                s.attribute("step_key") == Some("confirm")
                    || s.attribute("step_key").is_some_and(|k| k.contains("confirm"))
            })
    })
    .await;
    let runs = spans.iter().filter(|s| s.name == "workflow run").count();
    assert!(runs >= 1, "the resumed run is in the original trace: {spans:#?}");
    let seen = channel.traceparents();
    assert!(seen.len() >= 2 && seen.iter().all(|tp| tp.contains(RESUMED)), "the channel saw {seen:?}");
    second.kill().await.unwrap();
}
