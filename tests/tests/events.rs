//! The outbox on every backend: an event written inside the transaction of the outcome it reports — as a closure
//! step (every backend) and as one more write of a statement phase (Postgres, SQLite) — commits with it or not at
//! all, and a second write of one outcome makes no second event. The event log is in commit order: an event whose
//! transaction took its place first but committed last is never skipped by a reader paging meanwhile.

use std::time::Duration;

use onceflow_engine::Store as _;
use onceflow_engine::phase::{PhaseStep, SqlArg, StatementPhase};
use onceflow_engine::{
    BoxFuture, Engine, Failure, Interrupt, MySqlStore, Outcome, PgStore, SqliteStore, StepError, Workflow,
    WorkflowContext,
};
use onceflow_payments::events::{Endpoint, EndpointChange, NewDelivery, Position, outbox};
use onceflow_payments::{EventStore as _, EventType, NewEvent, PaymentStore, PhaseDialect};
use onceflow_tests::TestDb;
use serde::{Deserialize, Serialize};

const WAIT: Duration = Duration::from_secs(20);

/// A store of the tests with the dialect of its statement phases, if it has them.
trait EventsDb: TestDb + PaymentStore {
    const DIALECT: Option<PhaseDialect>;
}

impl EventsDb for PgStore {
    const DIALECT: Option<PhaseDialect> = Some(PhaseDialect::Postgres);
}

impl EventsDb for SqliteStore {
    const DIALECT: Option<PhaseDialect> = Some(PhaseDialect::Sqlite);
}

impl EventsDb for MySqlStore {
    const DIALECT: Option<PhaseDialect> = None;
}

/// What an [`Outcomes`] run does.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plan {
    /// The payment whose end the event reports.
    request_no: String,
    /// Write it in a statement phase (else in a closure step).
    phase: bool,
    /// The phase's guard holds / the step after the write succeeds: the outcome's commit stands.
    commit: bool,
}

/// A workflow that ends a pretend payment: an external step, then the outcome's commit, which writes the event.
struct Outcomes;

fn event(request_no: &str) -> NewEvent {
    let data = serde_json::json!({ "request_no": request_no, "status": "succeeded" }).to_string();
    NewEvent::payment("acme", request_no, EventType::PaymentSucceeded, data, 1_800_000_000_000)
}

impl<S: EventsDb> Workflow<S> for Outcomes {
    const NAME: &'static str = "outcomes";
    type Input = Plan;
    type Output = bool;

    async fn run(&self, ctx: &mut WorkflowContext<S>, plan: Plan) -> Result<bool, Interrupt> {
        // The charge: the outcome's commit is a later one, as a payment's is.
        ctx.external("charge", |_| async { Ok(()) }).await?;
        let event = event(&plan.request_no);
        if plan.phase {
            let d = S::DIALECT.expect("statement phases on this backend");
            let mut args = vec![SqlArg::Int(i64::from(plan.commit))];
            let parts = d.write("p_event", &outbox::phase_insert(&event, "TRUE", &mut args));
            let wrote = d.wrote("p_event");
            let steps = vec![PhaseStep::new("outcome", format!("CASE WHEN {wrote} THEN 'true' ELSE 'false' END"))];
            let phase = StatementPhase::new(parts, args, steps).guard("$1 = 1", Failure::new("undone", "the guard"));
            let outputs = ctx.statement_phase(phase).await?;
            return Ok(outputs[0].as_ref().and_then(serde_json::Value::as_bool).unwrap_or(false));
        }
        let written = ctx
            .transactional("outcome", move |conn| -> BoxFuture<'_, Result<bool, StepError>> {
                Box::pin(async move { S::write_event(conn, &event).await })
            })
            .await?;
        if !plan.commit {
            // In the same transaction as the write: its failure undoes the write.
            ctx.transactional("after", |_conn| -> BoxFuture<'_, Result<(), StepError>> {
                Box::pin(async { Err(StepError::Terminal(Failure::new("undone", "the step after the write"))) })
            })
            .await?;
        }
        Ok(written)
    }
}

async fn ids<S: EventsDb>(store: &S) -> Vec<String> {
    store.sequence().await.unwrap();
    let all = store.events_after(None, &Position::start(), &[], 1000).await.unwrap();
    all.events.into_iter().map(|e| e.id).collect()
}

async fn run<S: EventsDb>(engine: &Engine<S>, id: &str, plan: Plan) -> Option<Outcome> {
    engine.start::<Outcomes>(id, &plan).await.unwrap().wait(WAIT).await.unwrap()
}

onceflow_tests::on_every_backend!(
    a_delivery_is_made_only_while_its_event_and_an_enabled_endpoint_exist,
    an_event_commits_with_its_closure_step_or_not_at_all,
    an_event_is_written_once_per_outcome_in_a_transaction,
    the_log_never_skips_an_event_committed_after_a_later_one,
);
onceflow_tests::on_sqlite_and_postgres!(an_event_commits_with_its_statement_phase_or_not_at_all);

async fn an_event_commits_with_its_closure_step_or_not_at_all<S: EventsDb>(store: S) {
    let engine = Engine::builder(store.clone()).register(Outcomes).build();
    let undone = run(&engine, "w-undone", Plan { request_no: "R-1".into(), phase: false, commit: false }).await;
    assert!(matches!(undone, Some(Outcome::Failed(ref f)) if f.code == "undone"), "{undone:?}");
    assert!(ids(&store).await.is_empty(), "the step's failure rolled the event back with it");

    let done = run(&engine, "w-done", Plan { request_no: "R-1".into(), phase: false, commit: true }).await;
    assert_eq!(done, Some(Outcome::Completed(serde_json::json!(true))));
    assert_eq!(ids(&store).await, [event("R-1").id()]);

    // Another run ending the same payment (another process, a replay): no second event, and it is told.
    let again = run(&engine, "w-again", Plan { request_no: "R-1".into(), phase: false, commit: true }).await;
    assert_eq!(again, Some(Outcome::Completed(serde_json::json!(false))));
    assert_eq!(ids(&store).await, [event("R-1").id()]);
    let kept = store.event(&event("R-1").id()).await.unwrap().expect("the event");
    assert_eq!((kept.tenant.as_str(), kept.kind), ("acme", EventType::PaymentSucceeded));
    assert_eq!(kept.body()["data"]["request_no"], "R-1");
}

async fn an_event_commits_with_its_statement_phase_or_not_at_all<S: EventsDb>(store: S) {
    let engine = Engine::builder(store.clone()).register(Outcomes).build();
    let undone = run(&engine, "p-undone", Plan { request_no: "R-1".into(), phase: true, commit: false }).await;
    assert!(matches!(undone, Some(Outcome::Failed(ref f)) if f.code == "undone"), "{undone:?}");
    assert!(ids(&store).await.is_empty(), "the guard rolled the whole statement back, the event with it");

    let done = run(&engine, "p-done", Plan { request_no: "R-1".into(), phase: true, commit: true }).await;
    assert_eq!(done, Some(Outcome::Completed(serde_json::json!(true))));
    let again = run(&engine, "p-again", Plan { request_no: "R-1".into(), phase: true, commit: true }).await;
    assert_eq!(again, Some(Outcome::Completed(serde_json::json!(false))), "the phase saw the event exists");
    // The closure step's form finds the same outcome taken too.
    let closure = run(&engine, "p-closure", Plan { request_no: "R-1".into(), phase: false, commit: true }).await;
    assert_eq!(closure, Some(Outcome::Completed(serde_json::json!(false))));
    assert_eq!(ids(&store).await, [event("R-1").id()]);
}

async fn an_event_is_written_once_per_outcome_in_a_transaction<S: EventsDb>(store: S) {
    // Plain transactions of the store, as a backend's closure steps get them.
    let mut tx = store.begin().await.unwrap();
    assert!(S::write_event(&mut tx, &event("R-2")).await.unwrap());
    tx.rollback().await.unwrap();
    assert!(ids(&store).await.is_empty(), "rolled back: no event");

    let mut tx = store.begin().await.unwrap();
    assert!(S::write_event(&mut tx, &event("R-2")).await.unwrap());
    // The same outcome again in the same transaction, and with another type: still one event.
    let failed = NewEvent { kind: EventType::PaymentFailed, ..event("R-2") };
    assert!(!S::write_event(&mut tx, &failed).await.unwrap());
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert!(!S::write_event(&mut tx, &event("R-2")).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(ids(&store).await, [event("R-2").id()]);
    let kept = store.event(&event("R-2").id()).await.unwrap().unwrap();
    assert_eq!(kept.kind, EventType::PaymentSucceeded, "the first write stands");
}

async fn the_log_never_skips_an_event_committed_after_a_later_one<S: EventsDb>(store: S) {
    let page = |after: Position| {
        let store = store.clone();
        async move {
            store.sequence().await.unwrap();
            store.events_after(Some("acme"), &after, &[], 100).await.unwrap().events
        }
    };
    if store.backend() == "sqlite" {
        // One writer at a time: transactions cannot interleave; the log is in commit order.
        for r in ["R-a", "R-b"] {
            let mut tx = store.begin().await.unwrap();
            S::write_event(&mut tx, &event(r)).await.unwrap();
            tx.commit().await.unwrap();
        }
        let all: Vec<String> = page(Position::start()).await.into_iter().map(|e| e.id).collect();
        assert_eq!(all, [event("R-a").id(), event("R-b").id()]);
        return;
    }
    // A writes first (its transaction takes the smaller id / position), B writes later and commits first.
    let mut a = store.begin().await.unwrap();
    S::write_event(&mut a, &event("R-a")).await.unwrap();
    let mut b = store.begin().await.unwrap();
    S::write_event(&mut b, &event("R-b")).await.unwrap();
    b.commit().await.unwrap();
    // A reader now: B is committed, but A could still commit before it in the log's order, so the log shows
    // nothing past what can no longer change (or B, numbered after commit, with A to come after it).
    let first = page(Position::start()).await;
    let cursor = first.last().map_or_else(Position::start, |e| e.position());
    assert!(first.iter().all(|e| e.id == event("R-b").id()), "{first:?}");
    a.commit().await.unwrap();
    // From the cursor taken before A committed: A is there; nothing is lost. (On Postgres the log waits for
    // every older write transaction of the server to end, other tests' too: it may take a moment.)
    let started = std::time::Instant::now();
    let mut seen: Vec<String> = first.into_iter().map(|e| e.id).collect();
    let mut cursor = cursor;
    while seen.len() < 2 && started.elapsed() < WAIT {
        let rest = page(cursor.clone()).await;
        if let Some(last) = rest.last() {
            cursor = last.position();
        }
        seen.extend(rest.into_iter().map(|e| e.id));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.contains(&event("R-a").id()), "A, committed after the cursor was taken, was skipped: {seen:?}");
    seen.sort();
    let mut both = vec![event("R-a").id(), event("R-b").id()];
    both.sort();
    assert_eq!(seen, both, "each once");
}

/// On Postgres the log waits for older write transactions that could still commit an event before a position,
/// and only for those of its own database: a long one in another database of the server (a migration, a
/// `DROP DATABASE` elsewhere) delays nothing here.
#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_does_not_wait_for_another_databases_transactions() {
    let Some(store) = onceflow_tests::pg_store().await.unwrap() else { return };
    // A write transaction in another database (the one DATABASE_URL names), open throughout.
    let elsewhere = PgStore::connect(&std::env::var("DATABASE_URL").unwrap(), 1).await.unwrap();
    let mut other = elsewhere.pool().begin().await.unwrap();
    let xid: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text").fetch_one(&mut *other).await.unwrap();
    assert!(!xid.is_empty());
    let mut tx = store.begin().await.unwrap();
    PgStore::write_event(&mut tx, &event("R-now")).await.unwrap();
    tx.commit().await.unwrap();
    let started = std::time::Instant::now();
    let shown = store.events_after(Some("acme"), &Position::start(), &[], 10).await.unwrap().events;
    other.rollback().await.unwrap();
    assert_eq!(
        shown.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        [event("R-now").id()],
        "shown at once ({:?}), although a transaction of another database began before it and is still open",
        started.elapsed()
    );
    // A transaction of this database that began before does hold it back: it could still commit an event.
    let mut mine = store.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()").execute(&mut *mine).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    PgStore::write_event(&mut tx, &event("R-later")).await.unwrap();
    tx.commit().await.unwrap();
    let after = Position { major: shown[0].position, id: shown[0].id.clone() };
    assert!(store.events_after(Some("acme"), &after, &[], 10).await.unwrap().events.is_empty());
    mine.rollback().await.unwrap();
    assert_eq!(store.events_after(Some("acme"), &after, &[], 10).await.unwrap().events.len(), 1);
}

/// An enabled endpoint of `acme` created at `created_at`.
fn endpoint(id: &str, created_at: i64) -> Endpoint {
    Endpoint {
        id: id.to_owned(),
        tenant: "acme".to_owned(),
        url: "https://hooks.example/".to_owned(),
        events: None,
        secret: onceflow_payments::events::signing::new_secret(),
        previous_secret: None,
        previous_until: None,
        enabled: true,
        disabled_reason: None,
        created_at,
        updated_at: created_at,
    }
}

/// The interleavings of a redelivery (it reads the event, then makes its delivery) and of the dispatcher (it
/// reads the endpoints, then makes deliveries) with what removes their rows meanwhile — retention deleting the
/// event, a tenant deleting or disabling the endpoint — played in order: the late insert makes nothing, so no
/// delivery is left pending without its event or its endpoint.
async fn a_delivery_is_made_only_while_its_event_and_an_enabled_endpoint_exist<S: EventsDb>(store: S) {
    let now = i64::try_from(std::time::UNIX_EPOCH.elapsed().unwrap().as_millis()).unwrap();
    let (live, gone, off) = (endpoint("we_LIVE", now), endpoint("we_GONE", now), endpoint("we_OFF", now));
    for e in [&live, &gone, &off] {
        store.insert_endpoint(e).await.unwrap();
    }
    // Two events older than the endpoints (dispatched to none of them) and than any retention.
    let (old, kept) =
        (NewEvent { created_at: 1_000, ..event("R-old") }, NewEvent { created_at: 1_000, ..event("R-kept") });
    let mut tx = store.begin().await.unwrap();
    S::write_event(&mut tx, &old).await.unwrap();
    S::write_event(&mut tx, &kept).await.unwrap();
    tx.commit().await.unwrap();
    let started = std::time::Instant::now();
    while store.dispatch(500, now, "100").await.unwrap() == 0 {
        assert!(started.elapsed() < WAIT, "the dispatcher never passed the events");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let to =
        |event: &NewEvent, endpoint: &Endpoint| NewDelivery::redelivery(&event.id(), &endpoint.id, "acme", now, "100");
    // A redelivery read the event; retention deleted it; then the redelivery's insert comes.
    assert!(store.event(&old.id()).await.unwrap().is_some());
    let made = |m: Vec<bool>| m.into_iter().filter(|m| *m).count();
    assert_eq!(made(store.insert_deliveries(&[to(&kept, &live)]).await.unwrap()), 1);
    let mut from = Position::start();
    let batch = store.delete_events(&mut from, now, 500, false).await.unwrap();
    assert_eq!(batch.deleted, 1, "the old event goes, the one with a delivery pending stays");
    assert_eq!(made(store.insert_deliveries(&[to(&old, &live)]).await.unwrap()), 0, "a delivery of a deleted event");
    // The dispatcher read the endpoints; one was deleted, one disabled; then its inserts come.
    assert!(store.delete_endpoint(&gone.id, now).await.unwrap());
    let disable = EndpointChange { enabled: Some(false), ..EndpointChange::default() };
    assert!(store.update_endpoint(&off.id, &disable, now).await.unwrap().is_some_and(|e| !e.enabled));
    assert_eq!(made(store.insert_deliveries(&[to(&kept, &gone)]).await.unwrap()), 0, "to a deleted endpoint");
    assert_eq!(made(store.insert_deliveries(&[to(&kept, &off)]).await.unwrap()), 0, "to a disabled endpoint");
    assert_eq!(made(store.insert_deliveries(&[to(&kept, &live)]).await.unwrap()), 1, "while both exist: made");
    assert!(store.deliveries_of(&old.id()).await.unwrap().is_empty());
}
