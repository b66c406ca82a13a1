//! Odd paths and long histories (issue 35, point 9), on every backend: a NUL or bytes that are not UTF-8 in a
//! path name nothing (`404` problem+json, never a database error); the payments of an order, however many
//! attempts were refused on it, come a page at a time.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{App, database, start};
use onceflow_api::Auth;
use onceflow_payments::MockChannel;
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

on_every_backend!(odd_paths_name_nothing, an_orders_payments_come_a_page_at_a_time);

const ACME: &str = "acme-secret-key";
const OPERATOR: &str = "operator-secret-key";

fn keys() -> Auth {
    Auth::keys(vec![("acme".into(), ACME.into())]).with_operators(vec![("ops".into(), OPERATOR.into())])
}

fn as_key(app: &App, key: &str) -> App {
    App { base: app.base.clone(), client: app.client.clone(), key: Some(key.to_owned()) }
}

/// A NUL reached Postgres from a workflow id (`503` and a logged database error; SQLite `404`); bytes that are
/// not UTF-8 were answered `400` in `text/plain` by the path extractor. Every such path is `404` problem+json,
/// with the code of what it would have named.
async fn odd_paths_name_nothing(url: String) {
    let app = start(&url, Arc::new(MockChannel::reliable()), keys()).await;
    let (acme, operator) = (as_key(&app, ACME), as_key(&app, OPERATOR));
    for caller in [&acme, &operator] {
        for path in ["/v1/workflows/pay:%00x", "/v1/workflows/%00", "/v1/workflows/%FF", "/v1/workflows/a%C3%28"] {
            caller.get(path).await.assert_problem(404, "workflow_not_found");
        }
    }
    for path in ["/v1/workflows/pay:%00x/retry", "/v1/workflows/%FF/cancel"] {
        operator.post(path, json!({})).await.assert_problem(404, "workflow_not_found");
    }
    acme.get("/v1/orders/O%00").await.assert_problem(404, "order_not_found");
    acme.get("/v1/orders/%FF").await.assert_problem(404, "order_not_found");
    acme.get("/v1/payments/R%00").await.assert_problem(404, "payment_not_found");
    acme.get("/v1/payments/%FE%FF").await.assert_problem(404, "payment_not_found");
    acme.get("/v1/no-such/%FF").await.assert_problem(404, "not_found");
    // A query with a NUL is a bad request, as any invalid query.
    acme.get("/v1/payments?order_no=O%00").await.assert_problem(400, "invalid_request");
    acme.get("/v1/workflows?cursor=1.00").await.assert_problem(400, "invalid_request");
    // Found by review: free-text queries reached Postgres with the NUL (a 503 and a logged database error).
    for caller in [&acme, &operator] {
        for path in ["/v1/search?q=%00", "/v1/search?q=a%00b", "/v1/audit?workflow_id=%00"] {
            caller.get(path).await.assert_problem(400, "invalid_request");
        }
    }
    // The service is still well.
    assert_eq!(acme.get("/readyz").await.status, 200);
}

/// Every attempt on a paid order is refused (`409 order_not_payable`) and kept as a `failed` record — the
/// identity of its `request_no`, answered the same forever. Listing them is paged (keyset, newest first, the
/// shape of old: `payments`, plus `next_cursor`): each record exactly once, however many there are.
async fn an_orders_payments_come_a_page_at_a_time(url: String) {
    const REFUSED: usize = 30;
    let app = start(&url, Arc::new(MockChannel::reliable()), keys()).await;
    let acme = as_key(&app, ACME);
    acme.order("O-1", 1000).await;
    let body =
        |n: usize| json!({"order_no": "O-1", "amount": 1000, "currency": "CNY", "request_no": format!("R-{n:03}")});
    assert_eq!(acme.pay(&acme.token().await, body(0)).await.status, 201);
    for n in 1..=REFUSED {
        acme.pay(&acme.token().await, body(n)).await.assert_problem(409, "order_not_payable");
    }

    let all = acme.get("/v1/payments?order_no=O-1").await;
    assert_eq!(all.status, 200, "{}", all.text);
    assert_eq!(all.json()["payments"].as_array().unwrap().len(), REFUSED + 1);
    assert!(all.json()["next_cursor"].is_null(), "{}", all.text);

    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/payments?order_no=O-1&limit=7&cursor={c}"),
            None => "/v1/payments?order_no=O-1&limit=7".to_owned(),
        };
        let page = acme.get(&path).await;
        assert_eq!(page.status, 200, "{}", page.text);
        let page: Value = page.json();
        let payments = page["payments"].as_array().unwrap();
        assert!(payments.len() <= 7);
        seen.extend(payments.iter().map(|p| p["request_no"].as_str().unwrap().to_owned()));
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(next) => {
                assert!(!payments.is_empty(), "an empty page carries a cursor");
                cursor = Some(next.to_owned());
            }
            None => break,
        }
        assert!(pages < 20, "the pages do not end");
    }
    assert_eq!(pages, (REFUSED + 1).div_ceil(7));
    assert_eq!(seen.len(), REFUSED + 1, "{seen:?}");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), REFUSED + 1, "a payment listed twice: {seen:?}");
    let newest_first: Vec<String> = all.json()["payments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["request_no"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(seen, newest_first, "pages are not the list in order");
    assert_eq!(seen.last().map(String::as_str), Some("R-000"), "the oldest comes last");

    for bad in ["limit=0", "limit=1001", "cursor=x", "cursor=1.", "cursor=12.R%20", "limit=ten"] {
        acme.get(&format!("/v1/payments?order_no=O-1&{bad}")).await.assert_problem(400, "invalid_request");
    }
}
