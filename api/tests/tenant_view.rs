//! What a tenant sees of a workflow whose channel was down or refused (issue 35, point 4): the stable codes and
//! generic details, never the channel's URL, host or body; an operator still sees them. Channels served over
//! HTTP on loopback ports (one that is down, one that refuses with internals in its body), on every backend.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use common::{App, database, start};
use onceflow_api::Auth;
use onceflow_payments::HttpChannel;
use serde_json::{Value, json};

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::database("sqlite").await.unwrap()).await;
            }

            #[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(url) = super::database("postgres").await else {
                    eprintln!("skipped: DATABASE_URL is not set");
                    return;
                };
                super::$name(url).await;
            }

            #[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                let Some(url) = super::database("mysql").await else {
                    eprintln!("skipped: MYSQL_URL is not set");
                    return;
                };
                super::$name(url).await;
            }
        }
    )*};
}

on_every_backend!(a_tenant_does_not_see_a_down_channels_url, a_tenant_does_not_see_a_refusing_channels_body);

const ACME: &str = "acme-secret-key";
const OPERATOR: &str = "operator-secret-key";

fn keys() -> Auth {
    Auth::keys(vec![("acme".into(), ACME.into())]).with_operators(vec![("ops".into(), OPERATOR.into())])
}

fn as_key(app: &App, key: &str) -> App {
    App { base: app.base.clone(), client: app.client.clone(), key: Some(key.to_owned()) }
}

/// The workflow id of the tenant's payment `request_no`.
async fn workflow_of(app: &App, request_no: &str) -> String {
    let payment = app.get(&format!("/v1/payments/{request_no}")).await;
    payment.json()["workflow_id"].as_str().unwrap_or_else(|| panic!("{}", payment.text)).to_owned()
}

/// What must not reach a tenant: `needles`, in the workflow's view and in its page of the list.
async fn assert_hidden(tenant: &App, workflow_id: &str, needles: &[&str]) {
    let view = tenant.get(&format!("/v1/workflows/{workflow_id}")).await;
    assert_eq!(view.status, 200, "{}", view.text);
    let list = tenant.get("/v1/workflows").await;
    assert_eq!(list.status, 200, "{}", list.text);
    for needle in needles {
        assert!(!view.text.contains(needle), "a tenant sees `{needle}`: {}", view.text);
        assert!(!list.text.contains(needle), "a tenant's list shows `{needle}`: {}", list.text);
    }
}

/// A channel that is down (nothing listens on its port): each attempt's error names the URL it tried. The
/// tenant sees that the outcome is unknown; the operator sees the URL.
async fn a_tenant_does_not_see_a_down_channels_url(url: String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let down = format!("http://127.0.0.1:{port}/internal-gw");
    let channel = HttpChannel::new(&down, Duration::from_millis(500)).unwrap();
    let app = start(&url, Arc::new(channel), keys()).await;
    let (acme, operator) = (as_key(&app, ACME), as_key(&app, OPERATOR));
    acme.order("O-down", 1000).await;
    let body = json!({"order_no": "O-down", "amount": 1000, "currency": "CNY", "request_no": "R-down"});
    let token = acme.token().await;
    let accepted = acme
        .send(reqwest::Method::POST, "/v1/payments", &[("idempotency-key", &token), ("prefer", "wait=1")], Some(body))
        .await;
    assert_eq!(accepted.status, 202, "{}", accepted.text);
    let workflow_id = workflow_of(&acme, "R-down").await;

    // The operator sees the step's error with the URL once an attempt failed.
    let started = Instant::now();
    let seen = loop {
        let seen = operator.get(&format!("/v1/workflows/{workflow_id}")).await;
        if seen.text.contains("internal-gw") {
            break seen;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no attempt failed: {}", seen.text);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(seen.text.contains(&port.to_string()), "{}", seen.text);
    assert!(seen.text.contains("unknown outcome: channel unreachable: error sending request"), "{}", seen.text);
    assert_hidden(&acme, &workflow_id, &["internal-gw", "127.0.0.1", "http:", &port.to_string()]).await;
    // What the tenant does see: the step, its status, and a generic word on its error.
    let view = acme.get(&format!("/v1/workflows/{workflow_id}")).await.json();
    let step = view["steps"].as_array().unwrap().iter().find(|s| s["step_key"] == "call_channel").cloned().unwrap();
    // Between attempts (`unknown`), or in the next one (`started`): either way what the last one learnt.
    assert!(step["status"] == "unknown" || step["status"] == "started", "{step}");
    assert_eq!(step["error"], "unknown outcome: channel unreachable", "{step}");
}

/// A channel that refuses the charge with internals in its body (an acquirer's address, a risk score): the step's
/// output keeps the body for operators; the tenant sees the refusal's status and code.
async fn a_tenant_does_not_see_a_refusing_channels_body(url: String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refusing = format!("http://{}", listener.local_addr().unwrap());
    let router = Router::new().route(
        "/v1/charges",
        post(|| async {
            let body = json!({"error": "risk_rejected", "acquirer": "10.20.30.40:9443", "risk_score": 97.5});
            (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response()
        }),
    );
    tokio::spawn(axum::serve(listener, router).into_future());
    let channel = HttpChannel::new(&refusing, Duration::from_secs(2)).unwrap();
    let app = start(&url, Arc::new(channel), keys()).await;
    let (acme, operator) = (as_key(&app, ACME), as_key(&app, OPERATOR));
    acme.order("O-refused", 1000).await;
    let body = json!({"order_no": "O-refused", "amount": 1000, "currency": "CNY", "request_no": "R-refused"});
    let refused = acme.pay(&acme.token().await, body).await;
    refused.assert_problem(422, "channel_refused");
    let workflow_id = workflow_of(&acme, "R-refused").await;

    let seen = operator.get(&format!("/v1/workflows/{workflow_id}")).await;
    assert!(seen.text.contains("10.20.30.40") && seen.text.contains("risk_score"), "{}", seen.text);
    assert_hidden(&acme, &workflow_id, &["10.20.30.40", "risk_score", "acquirer", "97.5"]).await;
    let view: Value = acme.get(&format!("/v1/workflows/{workflow_id}")).await.json();
    assert_eq!(view["workflow"]["error"]["code"], "channel_refused", "{view}");
}
