//! Operations at scale (issue 20): roles, keyset paging of workflows, an order's payments, cheap metrics — on
//! SQLite, Postgres and MySQL.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{App, database, start};
use onceflow_api::{Auth, OnPayments, with_payments};
use onceflow_engine::store::{Cursor, WorkflowFilter, WorkflowRecord, WorkflowState};
use onceflow_engine::{EngineConfig, PgStore, Store};
use onceflow_payments::{MockChannel, MockChannelConfig, PaymentStore, Payments};
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

on_every_backend!(
    workflows_of_one_millisecond_page_exactly_once,
    pages_hold_while_workflows_are_added,
    the_largest_page_still_says_more_follow,
    a_tenant_pages_only_its_own_workflows,
    tenants_may_not_steer_operators_may,
    an_orders_payments_newest_first,
);

const ACME: &str = "acme-secret-key";
const GLOBEX: &str = "globex-secret-key";
const OPERATOR: &str = "operator-secret-key";

fn keys() -> Auth {
    Auth::keys(vec![("acme".into(), ACME.into()), ("globex".into(), GLOBEX.into())])
        .with_operators(vec![("ops".into(), OPERATOR.into())])
}

fn as_key(app: &App, key: &str) -> App {
    App { base: app.base.clone(), client: app.client.clone(), key: Some(key.to_owned()) }
}

/// The workflow of the payment `answer` is about.
async fn workflow_of(app: &App, answer: &common::Answer) -> String {
    let request_no = answer.json()["request_no"].as_str().expect("request_no").to_owned();
    let payment = app.get(&format!("/v1/payments/{request_no}")).await;
    payment.json()["workflow_id"].as_str().expect("workflow_id").to_owned()
}

fn pay_body(order_no: &str) -> Value {
    json!({"order_no": order_no, "amount": 1000, "currency": "CNY"})
}

/// `n` finished workflows, all created in the same millisecond, inserted straight into the store (as many
/// concurrent starts in one millisecond would leave them).
async fn insert_same_millisecond(url: &str, n: usize, tenant: Option<&'static str>) -> HashSet<String> {
    insert_workflows(url, n, tenant, 1_700_000_000_000, "same-ms").await
}

/// `n` finished workflows created at `created_at`, ids `<prefix>-<i>-<tenant>`.
async fn insert_workflows(
    url: &str,
    n: usize,
    tenant: Option<&'static str>,
    created_at: i64,
    prefix: &'static str,
) -> HashSet<String> {
    struct Insert(usize, Option<&'static str>, i64, &'static str);
    impl OnPayments for Insert {
        type Output = HashSet<String>;
        async fn run<S: PaymentStore>(self, payments: Payments<S>) -> HashSet<String> {
            let store = payments.engine().store();
            let mut ids = HashSet::new();
            let mut tx = store.begin().await.unwrap();
            for i in 0..self.0 {
                let id = format!("{}-{i:03}-{}", self.3, self.1.unwrap_or("none"));
                let record = WorkflowRecord {
                    workflow_id: id.clone(),
                    name: "payment".into(),
                    input: json!({"tenant": self.1}).to_string(),
                    input_hash: "x".into(),
                    state: WorkflowState::Completed,
                    output: Some("{}".into()),
                    error: None,
                    lease_owner: None,
                    lease_expires_at: None,
                    lease_epoch: 1,
                    next_attempt_at: self.2,
                    notify: false,
                    created_at: self.2,
                    updated_at: self.2,
                    tenant: self.1.map(str::to_owned),
                    trace: None,
                };
                assert!(store.insert_workflow(&mut tx, &record, &[]).await.unwrap());
                ids.insert(id);
            }
            tx.commit().await.unwrap();
            ids
        }
    }
    let channel = Arc::new(MockChannel::reliable());
    with_payments(url, channel, EngineConfig::default(), 2, Insert(n, tenant, created_at, prefix))
        .await
        .expect("database")
}

/// Every page of `GET /v1/workflows?{query}` through `next_cursor`: the pages' workflow ids, and whether an
/// empty page carried a cursor.
async fn pages(app: &App, query: &str) -> Vec<Vec<Value>> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/workflows?{query}&cursor={c}"),
            None => format!("/v1/workflows?{query}"),
        };
        let page = app.get(&path).await;
        assert_eq!(page.status, 200, "{}", page.text);
        let body = page.json();
        let workflows = body["workflows"].as_array().unwrap().clone();
        let next = body["next_cursor"].as_str().map(str::to_owned);
        assert!(!(workflows.is_empty() && next.is_some()), "an empty page carries no cursor: {}", page.text);
        assert_eq!(body["next_before"].is_null(), next.is_none(), "next_before stays with the cursor: {}", page.text);
        pages.push(workflows);
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages.len() < 200, "paging does not end");
    }
    pages
}

async fn workflows_of_one_millisecond_page_exactly_once(url: String) {
    let inserted = insert_same_millisecond(&url, 100, None).await;
    let app = start(&url, Arc::new(MockChannel::reliable()), Auth::SingleTenant).await;
    let mut seen = Vec::new();
    for page in pages(&app, "limit=7").await {
        assert!(page.len() <= 7);
        seen.extend(page.into_iter().map(|w| w["workflow_id"].as_str().unwrap().to_owned()));
    }
    let unique: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), 100, "each workflow exactly once: {seen:?}");
    assert_eq!(unique, inserted);
    // Newest first, and in one millisecond by workflow id: the order a cursor continues.
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted);
    // A cursor that is not one of ours is a 400, not a guess.
    app.get("/v1/workflows?cursor=not-a-cursor").await.assert_problem(400, "invalid_request");
}

/// Workflows started while a client pages (newer than its cursor) are not on its later pages, and shift nothing:
/// every workflow that was there is listed once; one inserted behind the cursor (an older creation time, as a
/// start in a process with a slower clock leaves) is listed once too.
async fn pages_hold_while_workflows_are_added(url: String) {
    const T: i64 = 1_700_000_000_000;
    let before = insert_workflows(&url, 30, None, T, "old").await;
    let app = start(&url, Arc::new(MockChannel::reliable()), Auth::SingleTenant).await;
    let (mut seen, mut cursor, mut newer, mut behind) = (Vec::new(), None::<String>, HashSet::new(), HashSet::new());
    for page_no in 0.. {
        let path = match &cursor {
            Some(c) => format!("/v1/workflows?limit=7&cursor={c}"),
            None => "/v1/workflows?limit=7".to_owned(),
        };
        let body = app.get(&path).await.json();
        seen.extend(
            body["workflows"].as_array().unwrap().iter().map(|w| w["workflow_id"].as_str().unwrap().to_owned()),
        );
        if page_no == 0 {
            newer = insert_workflows(&url, 10, None, T + 1, "newer").await;
        }
        if page_no == 2 {
            behind = insert_workflows(&url, 5, None, T - 1, "behind").await;
        }
        match body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let unique: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no workflow twice: {seen:?}");
    assert!(before.is_subset(&unique) && behind.is_subset(&unique), "{seen:?}");
    assert!(newer.is_disjoint(&unique), "newer than the cursor: on no later page");
    assert_eq!(seen.len(), 35);
}

/// A page of the largest size (1,000) reads one row more to know whether another follows.
async fn the_largest_page_still_says_more_follow(url: String) {
    insert_workflows(&url, 1001, None, 1_700_000_000_000, "big").await;
    let app = start(&url, Arc::new(MockChannel::reliable()), Auth::SingleTenant).await;
    let pages = pages(&app, "limit=1000").await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [1000, 1]);
}

async fn a_tenant_pages_only_its_own_workflows(url: String) {
    let base = start(&url, Arc::new(MockChannel::reliable()), keys()).await;
    let (acme, globex, operator) = (as_key(&base, ACME), as_key(&base, GLOBEX), as_key(&base, OPERATOR));
    let mut acme_ids = HashSet::new();
    for i in 0..3 {
        acme.order(&format!("O-a{i}"), 1000).await;
        let answer = acme.pay(&acme.token().await, pay_body(&format!("O-a{i}"))).await;
        assert_eq!(answer.status, 201, "{}", answer.text);
        acme_ids.insert(workflow_of(&acme, &answer).await);
    }
    for i in 0..12 {
        globex.order(&format!("O-g{i}"), 1000).await;
        let token = globex.token().await;
        assert_eq!(globex.pay(&token, pay_body(&format!("O-g{i}"))).await.status, 201);
    }
    // The other tenant's workflows are the newest: a page filtered after the read would come back empty.
    let mut seen = HashSet::new();
    let all = pages(&acme, "limit=2").await;
    for page in &all {
        for w in page {
            assert_eq!(w["input"]["tenant"], "acme", "{w}");
            assert!(seen.insert(w["workflow_id"].as_str().unwrap().to_owned()));
        }
    }
    assert_eq!(seen, acme_ids);
    assert_eq!(all.len(), 2, "3 workflows in pages of 2: two pages, the last without a cursor");
    // In one state, still only its own.
    let completed: usize = pages(&globex, "state=completed&limit=5").await.iter().map(Vec::len).sum();
    assert_eq!(completed, 12);
    // Operators see every tenant's.
    let everything: usize = pages(&operator, "limit=4").await.iter().map(Vec::len).sum();
    assert_eq!(everything, 15);
    // The millisecond `before` of older clients still works.
    let first = acme.get("/v1/workflows?limit=1").await.json();
    let before = first["next_before"].as_i64().expect("next_before");
    let older = acme.get(&format!("/v1/workflows?before={before}")).await;
    assert_eq!(older.status, 200, "{}", older.text);
}

async fn tenants_may_not_steer_operators_may(url: String) {
    // A channel that holds each charge, so that a payment is still running when it is cancelled.
    let channel = MockChannel::new(MockChannelConfig { latency_ms: 3_000, ..Default::default() });
    let base = start(&url, Arc::new(channel.clone()), keys()).await;
    let (acme, globex, operator) = (as_key(&base, ACME), as_key(&base, GLOBEX), as_key(&base, OPERATOR));
    acme.order("O-1", 1000).await;
    globex.order("O-1", 1000).await;
    let acme_token = acme.token().await;
    let globex_token = globex.token().await;
    let mut ids = Vec::new();
    for (app, token) in [(&acme, &acme_token), (&globex, &globex_token)] {
        let headers = [("idempotency-key", token.as_str()), ("prefer", "wait=0")];
        let started = app.send(reqwest::Method::POST, "/v1/payments", &headers, Some(pay_body("O-1"))).await;
        assert_eq!(started.status, 202, "{}", started.text);
        ids.push(workflow_of(app, &started).await);
    }
    let (acme_wf, globex_wf) = (ids[0].clone(), ids[1].clone());
    // A tenant may look at its own workflow, but not steer it, nor anyone else's.
    assert_eq!(acme.get(&format!("/v1/workflows/{acme_wf}")).await.status, 200);
    for wf in [&acme_wf, &globex_wf] {
        acme.post(&format!("/v1/workflows/{wf}/cancel"), json!({})).await.assert_problem(403, "forbidden");
        acme.post(&format!("/v1/workflows/{wf}/retry"), json!({})).await.assert_problem(403, "forbidden");
    }
    // Another tenant's workflow id, even guessed right, is not found.
    acme.get(&format!("/v1/workflows/{globex_wf}")).await.assert_problem(404, "workflow_not_found");
    // An operator sees and steers both tenants' workflows.
    for wf in [&acme_wf, &globex_wf] {
        assert_eq!(operator.get(&format!("/v1/workflows/{wf}")).await.status, 200);
        let cancelled = operator.post(&format!("/v1/workflows/{wf}/cancel"), json!({})).await;
        assert_eq!(cancelled.status, 200, "{}", cancelled.text);
        assert_eq!(cancelled.json()["state"], "compensating");
        // Once cancelled it is not running: a second cancel is the engine's 409, not a 403; so is a retry of a
        // workflow that did not fail (the operator may ask; the engine decides).
        operator.post(&format!("/v1/workflows/{wf}/cancel"), json!({})).await.assert_problem(409, "invalid_state");
        operator.post(&format!("/v1/workflows/{wf}/retry"), json!({})).await.assert_problem(409, "invalid_state");
    }
    // The runs that were in the channel call when cancelled are fenced out: each workflow ends cancelled (its
    // compensations run), never completed by the run that was overtaken.
    for wf in [&acme_wf, &globex_wf] {
        let mut state = String::new();
        for _ in 0..200 {
            state = operator.get(&format!("/v1/workflows/{wf}")).await.json()["workflow"]["state"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if state != "compensating" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(state, "cancelled", "{wf}");
    }
    // Undone: each order payable again, and no charge kept at the channel.
    for (app, merchant) in [(&acme, "acme"), (&globex, "globex")] {
        assert_eq!(app.get("/v1/orders/O-1").await.json()["status"], "pending");
        assert_eq!(channel.ledger().kept_charges_of(merchant, "O-1"), 0);
    }
    // An operator is nobody's tenant: tenant business routes are not for its key.
    operator.get("/v1/orders/O-1").await.assert_problem(403, "forbidden");
    operator.post("/v1/tokens", json!({})).await.assert_problem(403, "forbidden");
    // Metrics are for operators once operator keys are configured.
    acme.get("/metrics").await.assert_problem(403, "forbidden");
    as_key(&base, "nobody-at-all").get("/metrics").await.assert_problem(401, "unauthorized");
    assert_eq!(operator.get("/metrics").await.status, 200);
}

async fn an_orders_payments_newest_first(url: String) {
    // The first attempt is declined, the second (a fresh token, the order payable again) charged.
    let declining = MockChannel::new(MockChannelConfig { decline_rate: 1.0, ..Default::default() });
    let first = start(&url, Arc::new(declining), keys()).await;
    let acme = as_key(&first, ACME);
    acme.order("O-1", 1000).await;
    let declined = acme.pay(&acme.token().await, pay_body("O-1")).await;
    declined.assert_problem(402, "payment_declined");
    let second = start(&url, Arc::new(MockChannel::reliable()), keys()).await;
    let (acme, globex) = (as_key(&second, ACME), as_key(&second, GLOBEX));
    let paid = acme.pay(&acme.token().await, pay_body("O-1")).await;
    assert_eq!(paid.status, 201, "{}", paid.text);
    // Another tenant's order of the same number is not acme's.
    globex.order("O-1", 1000).await;
    assert_eq!(globex.pay(&globex.token().await, pay_body("O-1")).await.status, 201);

    let listed = acme.get("/v1/payments?order_no=O-1").await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let payments = listed.json()["payments"].as_array().unwrap().clone();
    let statuses: Vec<&str> = payments.iter().map(|p| p["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["succeeded", "declined"], "{}", listed.text);
    assert_eq!(payments[0]["request_no"], paid.json()["request_no"]);
    assert!(payments.iter().all(|p| p["order_no"] == "O-1" && p["request_no"].is_string()));
    let theirs = globex.get("/v1/payments?order_no=O-1").await.json();
    assert_eq!(theirs["payments"].as_array().unwrap().len(), 1);
    assert_eq!(acme.get("/v1/payments?order_no=O-none").await.json()["payments"], json!([]));
    acme.get("/v1/payments?order_no=not%20valid").await.assert_problem(400, "invalid_request");
    // A query it cannot read (a field twice) is a problem too, not plain text.
    acme.get("/v1/payments?order_no=O-1&order_no=O-2").await.assert_problem(400, "invalid_request");
    acme.get("/v1/payments").await.assert_problem(400, "invalid_request");
}

/// The tenant list query reads the `(tenant, created_at, workflow_id)` index, in order, with no sort.
#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_query_uses_the_index_on_postgres() {
    let Some(url) = database("postgres").await else { return };
    insert_same_millisecond(&url, 50, Some("acme")).await;
    insert_same_millisecond(&url, 50, None).await;
    let store = PgStore::connect(&url, 2).await.unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    // With 100 rows a sequential scan and a sort is the cheaper plan, and the planner would rightly take it;
    // off, the index must still serve the query without a sort (a plan that cannot use it would still seq
    // scan: `enable_seqscan = off` only makes it very expensive).
    sqlx::query("SET enable_seqscan = off").execute(&mut *conn).await.unwrap();
    let cursor = Cursor { created_at: 1_700_000_000_000, workflow_id: "same-ms-020-acme".into() };
    let tenant = |state, after| WorkflowFilter { tenant: Some("acme"), state, after, name: None };
    for (filter, index) in [
        (tenant(None, None), "workflows_tenant_page"),
        (tenant(None, Some(&cursor)), "workflows_tenant_page"),
        (tenant(Some(WorkflowState::Completed), Some(&cursor)), "workflows_tenant_page"),
        // Every tenant's: one branch per state, each on the state's range of workflows_state (sorting a
        // millisecond's rows by id: on this small table the planner sorts the branch whole, on a large one it
        // sorts incrementally; see engine/src/store/postgres/list.rs).
        (WorkflowFilter { after: Some(&cursor), ..Default::default() }, "workflows_state"),
        (WorkflowFilter { state: Some(WorkflowState::Completed), ..Default::default() }, "workflows_state"),
    ] {
        let plan = PgStore::explain_list(&mut conn, filter, 21).await.unwrap();
        assert!(plan.contains(&format!("Index Scan Backward using {index}")), "{filter:?}\n{plan}");
        assert!(!plan.contains("Seq Scan"), "{filter:?}\n{plan}");
        if filter.tenant.is_some() {
            assert!(!plan.contains("Sort"), "the index gives the order: no sort\n{plan}");
        }
    }
}

/// A scrape while the database is gone says so (`onceflow_database_up 0`), and keeps the last counts.
#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_say_the_database_is_down() {
    let Some(url) = database("postgres").await else { return };
    let app = start(&url, Arc::new(MockChannel::reliable()), Auth::SingleTenant).await;
    app.order("O-1", 1000).await;
    assert_eq!(app.pay(&app.token().await, pay_body("O-1")).await.status, 201);
    let up = app.get("/metrics").await;
    assert!(up.text.contains("onceflow_database_up 1"), "{}", up.text);
    // The first scrape started a count in the background; a later one shows it (and no scrape scans).
    let mut counted = String::new();
    for _ in 0..50 {
        counted = app.get("/metrics").await.text;
        if counted.contains("onceflow_workflows{state=\"completed\"}") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(counted.contains("onceflow_workflows{state=\"completed\"} 1"), "{counted}");
    assert!(counted.contains("onceflow_workflows{state=\"running\"} 0"), "{counted}");
    assert!(counted.contains("onceflow_workflows_counted_timestamp_seconds "), "{counted}");
    // Drop the test's own database under the running app (the shared server stays up).
    let name = url.rsplit('/').next().unwrap().to_owned();
    let admin = PgStore::connect(&std::env::var("DATABASE_URL").unwrap(), 1).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)"))).execute(admin.pool()).await.unwrap();
    let down = app.get("/metrics").await;
    assert_eq!(down.status, 200);
    assert!(down.text.contains("onceflow_database_up 0"), "{}", down.text);
    // The last counts stay, with their time: not zeros.
    assert!(down.text.contains("onceflow_workflows{state=\"completed\"} 1"), "{}", down.text);
}
