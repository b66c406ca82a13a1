//! Postgres group commit: one-statement commits of different workflows that wait for a slot go together in one
//! transaction, and each member gets exactly its own outcome — a lost lease, a guard that does not hold, a
//! duplicate start, a duplicate business key, a database error and plain successes in one batch — with nothing of
//! a refused member written and nothing of the others lost. The one slot is held by a commit waiting on a row
//! lock this test holds, so that the others queue behind it and are sent as one batch when it is let go. A
//! batch of successes commits once; a member waiting for a row lock leaves its batch without holding the others.

use std::time::Duration;

use onceflow_engine::phase::{PhaseCommit, PhaseRow, PhaseStep, SqlArg, StatementPhase};
use onceflow_engine::store::{
    Checkpoint, Committed, Fence, StepKind, StepStatus, WorkflowRecord, WorkflowState, WorkflowUpdate, WorkflowWrite,
};
use onceflow_engine::{Failure, PgStore, Store, step};
use sqlx::Connection;

const NOW: i64 = 1_000_000;

fn record(id: &str, epoch: i64) -> WorkflowRecord {
    WorkflowRecord {
        workflow_id: id.to_owned(),
        name: "batched".to_owned(),
        input: "null".to_owned(),
        input_hash: "h".to_owned(),
        state: WorkflowState::Running,
        output: None,
        error: None,
        lease_owner: Some("me".to_owned()),
        lease_expires_at: Some(NOW + 60_000),
        lease_epoch: epoch,
        next_attempt_at: NOW,
        notify: false,
        created_at: NOW,
        updated_at: NOW,
        tenant: None,
        trace: None,
    }
}

/// What one commit of the test does.
#[derive(Clone)]
enum Commit {
    /// The first commit of workflow `id`, with a phase inserting business key `key` (if any).
    Insert { id: String, key: Option<String> },
    /// A later commit of `id` fenced by `epoch`, with a phase inserting `key` (if any) guarded by `guard`.
    Fence { id: String, epoch: i64, key: Option<String>, guard: bool },
}

/// The phase: inserts `key` into `group_keys` unless it is there (`ON CONFLICT DO NOTHING`), guarded by `guard`
/// (the insert happened, or `FALSE`); or, with `plain`, a plain insert that a taken key makes fail.
fn phase(id: &str, key: &str, guard: bool, plain: bool) -> StatementPhase {
    let conflict = if plain { "" } else { " ON CONFLICT DO NOTHING" };
    let cte = format!("k AS (INSERT INTO group_keys (k, workflow_id) VALUES ($1, $2){conflict} RETURNING 1)");
    let args = vec![SqlArg::Text(key.to_owned()), SqlArg::Text(id.to_owned())];
    let steps = vec![PhaseStep::new(step("write"), WRITTEN)];
    let condition = if guard { "EXISTS (SELECT 1 FROM k)" } else { "FALSE" };
    StatementPhase::new(vec![cte], args, steps).guard(condition, Failure::new("taken", "the key is taken"))
}

async fn run(store: &PgStore, commit: Commit) -> Result<Committed, String> {
    let (id, key, guard) = match &commit {
        Commit::Insert { id, key } => (id.clone(), key.clone(), true),
        Commit::Fence { id, key, guard, .. } => (id.clone(), key.clone(), *guard),
    };
    let plain = key.as_deref().is_some_and(|k| k.starts_with("plain"));
    let phase = key.as_deref().map(|k| phase(&id, k, guard, plain));
    let rows: Vec<PhaseRow<'_>> = phase
        .iter()
        .map(|_| PhaseRow {
            key: "write".to_owned(),
            name: "write",
            kind: StepKind::Transactional,
            status: StepStatus::Completed,
            attempts: 1,
            output: WRITTEN,
            finished: true,
            when: None,
            seq: 1,
        })
        .collect();
    let update =
        WorkflowUpdate { state: Some(WorkflowState::Completed), output: Some("1".to_owned()), ..Default::default() };
    let row = record(&id, 1);
    let workflow = match &commit {
        Commit::Insert { .. } => WorkflowWrite::Insert(&row),
        Commit::Fence { epoch, .. } => {
            WorkflowWrite::Fence(Fence { workflow_id: &id, epoch: *epoch, update: &update, now: NOW })
        }
    };
    let checkpoint = Checkpoint { workflow, steps: &[], compensations: None, leases_by_database: false };
    let phase = phase.as_ref().map(|phase| PhaseCommit { phase, rows: &rows, now: NOW });
    match store.commit_in_one_call(&checkpoint, phase, true).await {
        Ok(Some(outcome)) => Ok(outcome),
        Ok(None) => panic!("Postgres commits in one call"),
        Err(e) => Err(e.to_string()),
    }
}

/// The phase's one step's output: its workflow's id (the phase's `$2`) as a JSON string, so that an answer
/// given to the wrong member shows.
const WRITTEN: &str = "'\"' || $2 || '\"'";

/// Done, with the phase's one output read back from the answer (the batched form's columns as the lone one's):
/// the id of the workflow `id`.
fn written(outcome: &Result<Committed, String>, id: &str) -> bool {
    matches!(outcome, Ok(Committed::Done { outputs, .. }) if outputs[..] == [Some(format!("\"{id}\""))])
}

fn done(outcome: &Result<Committed, String>) -> bool {
    matches!(outcome, Ok(Committed::Done { .. }))
}

/// A business key that SQL quoting must get right.
const QUOTED: &str = "a'b\\c\"é";

#[tokio::test]
async fn each_member_of_a_batch_gets_its_own_outcome() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else { return };
    let workflows = [("blocker", 1), ("ok", 1), ("lost", 5), ("guarded", 1), ("dup", 1), ("plain", 1)];
    let store = store_with(&url, &workflows).await;
    sqlx::query("INSERT INTO group_keys VALUES ('plain-taken', 'elsewhere')").execute(store.pool()).await.unwrap();

    let (release, blocked) = occupy_slot(&store, &url, "blocker").await;
    let before = store.group_commit_counts();

    let members = vec![
        // A key with a quote, a backslash and a letter beyond ASCII: passed to the batch as text, quoted there.
        ("ok", Commit::Fence { id: "ok".into(), epoch: 1, key: Some(QUOTED.into()), guard: true }),
        ("lost", Commit::Fence { id: "lost".into(), epoch: 1, key: Some("b".into()), guard: true }),
        ("guarded", Commit::Fence { id: "guarded".into(), epoch: 1, key: Some("c".into()), guard: false }),
        ("dup", Commit::Insert { id: "dup".into(), key: Some("d".into()) }),
        ("new1", Commit::Insert { id: "new1".into(), key: Some("same".into()) }),
        ("new2", Commit::Insert { id: "new2".into(), key: Some("same".into()) }),
        ("plain", Commit::Fence { id: "plain".into(), epoch: 1, key: Some("plain-taken".into()), guard: true }),
        ("new3", Commit::Insert { id: "new3".into(), key: None }),
    ];
    let mut handles = Vec::new();
    for (name, commit) in members {
        let store = store.clone();
        handles.push((name, tokio::spawn(async move { run(&store, commit).await })));
        // Queued in this order.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!blocked.is_finished(), "the blocker waits on the row lock");
    let _ = release.send(());
    assert!(done(&blocked.await.unwrap()));

    let mut outcomes = std::collections::HashMap::new();
    for (name, handle) in handles {
        outcomes.insert(name, tokio::time::timeout(Duration::from_secs(20), handle).await.unwrap().unwrap());
    }
    let after = store.group_commit_counts();
    assert_eq!(after.0 - before.0, 1, "one batch: {before:?} → {after:?}");
    // Answered by the batch: all but `plain`, which left it (below). Were the batch refused as a whole, each
    // would have run alone, with the same outcomes, and none counted.
    assert_eq!(after.1 - before.1, 7, "the batch answered the queued commits: {before:?} → {after:?}");

    assert!(written(&outcomes["ok"], "ok"), "{:?}", outcomes["ok"]);
    assert!(matches!(outcomes["lost"], Ok(Committed::LeaseLost)), "{:?}", outcomes["lost"]);
    assert!(matches!(outcomes["guarded"], Ok(Committed::GuardFailed)), "{:?}", outcomes["guarded"]);
    assert!(matches!(outcomes["dup"], Ok(Committed::Duplicate)), "{:?}", outcomes["dup"]);
    assert!(written(&outcomes["new1"], "new1"), "{:?}", outcomes["new1"]);
    // The same key as new1, in the same batch: new1 took it, so new2's guard does not hold.
    assert!(matches!(outcomes["new2"], Ok(Committed::GuardFailed)), "{:?}", outcomes["new2"]);
    assert!(done(&outcomes["new3"]), "{:?}", outcomes["new3"]);
    // A plain insert of a taken key fails its statement (a unique violation, no check of ours): it leaves the
    // batch, runs alone after it and gets the error a lone commit gets, without touching the others.
    let plain = outcomes["plain"].as_ref().expect_err("a unique violation");
    assert!(plain.contains("group_keys_pkey"), "{plain}");

    // What is in the database is exactly the successes.
    let keys: Vec<(String, String)> =
        sqlx::query_as("SELECT k, workflow_id FROM group_keys ORDER BY k").fetch_all(store.pool()).await.unwrap();
    let keys: Vec<(&str, &str)> = keys.iter().map(|(k, w)| (k.as_str(), w.as_str())).collect();
    assert_eq!(keys, [(QUOTED, "ok"), ("plain-taken", "elsewhere"), ("same", "new1")]);
    let states: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT workflow_id, state, lease_epoch FROM workflows ORDER BY workflow_id")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let states: Vec<(&str, &str, i64)> = states.iter().map(|(w, s, e)| (w.as_str(), s.as_str(), *e)).collect();
    assert_eq!(
        states,
        [
            ("blocker", "completed", 1),
            ("dup", "running", 1),
            ("guarded", "running", 1),
            ("lost", "running", 5),
            ("new1", "running", 1),
            ("new3", "running", 1),
            ("ok", "completed", 1),
            ("plain", "running", 1),
        ]
    );
    let steps: Vec<String> = sqlx::query_scalar("SELECT workflow_id FROM workflow_steps ORDER BY workflow_id")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(steps, ["new1", "ok"]);
}

/// A store with one commit slot (every commit after the first queues, and the queue goes as one batch), held by
/// a commit as long as it runs (not `SLOT_HOLD`: the tests hold it with a commit that waits for a row), the
/// `group_keys` table and `workflows` (id, epoch) inserted.
async fn store_with(url: &str, workflows: &[(&str, i64)]) -> PgStore {
    let store = PgStore::connect(url, 16).await.unwrap().group_commit_holding(1, Duration::from_secs(600));
    sqlx::query("CREATE TABLE group_keys (k TEXT PRIMARY KEY, workflow_id TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    for &(id, epoch) in workflows {
        let mut conn = store.pool().acquire().await.unwrap();
        assert!(store.insert_workflow(&mut conn, &record(id, epoch), &[]).await.unwrap());
    }
    store
}

/// Takes the one slot with a commit of `id` that waits for its row, held until the returned sender is used.
async fn occupy_slot(
    store: &PgStore,
    url: &str,
    id: &'static str,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<Committed, String>>) {
    let release = hold_row(url, id).await;
    let blocked = spawn_run(store, Commit::Fence { id: id.into(), epoch: 1, key: None, guard: true });
    wait_for_lock_wait(store).await;
    (release, blocked)
}

/// [`run`] in a task of its own.
fn spawn_run(store: &PgStore, commit: Commit) -> tokio::task::JoinHandle<Result<Committed, String>> {
    let store = store.clone();
    tokio::spawn(async move { run(&store, commit).await })
}

/// After the commits of `handles` have queued, lets the slot's blocker go: it and each of them must be done.
async fn release_then_all_done(
    release: tokio::sync::oneshot::Sender<()>,
    blocked: tokio::task::JoinHandle<Result<Committed, String>>,
    handles: impl IntoIterator<Item = (&'static str, tokio::task::JoinHandle<Result<Committed, String>>)>,
) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = release.send(());
    assert!(done(&blocked.await.unwrap()));
    for (id, handle) in handles {
        let outcome = tokio::time::timeout(Duration::from_secs(20), handle).await.unwrap().unwrap();
        assert!(written(&outcome, id), "{id}: {outcome:?}");
    }
}

/// Waits until a statement of this database waits for a lock.
async fn wait_for_lock_wait(store: &PgStore) {
    wait_for_lock_waits(store, 1).await;
}

/// Waits until `n` statements of this database wait for a lock.
async fn wait_for_lock_waits(store: &PgStore, n: i64) {
    for _ in 0..200 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} statements never waited for a lock");
}

/// Holds `id`'s workflow row in a transaction of its own until the returned sender is dropped or sent to.
async fn hold_row(url: &str, id: &str) -> tokio::sync::oneshot::Sender<()> {
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (held, holding) = tokio::sync::oneshot::channel();
    let url = url.to_owned();
    let sql = format!("SELECT 1 FROM workflows WHERE workflow_id = '{id}' FOR UPDATE");
    tokio::spawn(async move {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut *tx).await.unwrap();
        let _ = held.send(());
        let _ = released.await;
        tx.commit().await.unwrap();
    });
    holding.await.unwrap();
    release
}

#[tokio::test]
async fn a_batch_of_successes_commits_once_and_a_locked_member_holds_up_no_one() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else { return };
    let ids = ["blocker", "blocker2", "locked", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "t1", "t2", "t3"];
    let store = store_with(&url, &ids.map(|id| (id, 1))).await;
    let fence = |id: &str| Commit::Fence { id: id.into(), epoch: 1, key: Some(format!("key-{id}")), guard: true };

    // Eight successes queued behind the blocker: one batch, all answered by it and committed.
    let (release, blocked) = occupy_slot(&store, &url, "blocker").await;
    let before = store.group_commit_counts();
    let handles = ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"].map(|id| (id, spawn_run(&store, fence(id))));
    release_then_all_done(release, blocked, handles).await;
    let after = store.group_commit_counts();
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 8), "{before:?} → {after:?}");
    let committed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workflows WHERE state = 'completed' AND workflow_id LIKE 's%'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(committed, 8);

    // A member whose row another transaction holds: it leaves the batch (lock timeout), the others commit and
    // are answered while it waits, alone, holding no slot; it commits when the row is let go.
    let hold = hold_row(&url, "locked").await;
    let (release, blocked) = occupy_slot(&store, &url, "blocker2").await;
    let locked = spawn_run(&store, fence("locked"));
    let handles = ["t1", "t2", "t3"].map(|id| (id, spawn_run(&store, fence(id))));
    release_then_all_done(release, blocked, handles).await;
    // The slot is free again: a new commit goes through while the locked member still waits.
    let next = run(&store, Commit::Fence { id: "s1".into(), epoch: 1, key: None, guard: true }).await;
    assert!(done(&next), "{next:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!locked.is_finished(), "the locked member waits for its row");
    let _ = hold.send(());
    let outcome = tokio::time::timeout(Duration::from_secs(20), locked).await.unwrap().unwrap();
    assert!(done(&outcome), "{outcome:?}");
}

/// A held connection the server ended while it sat idle (a restart, `pg_terminate_backend`,
/// `idle_session_timeout`) is pinged before it is lent again, and a connection that answers takes its place: the
/// next commit, alone or a batch, is written and answered, not lost on the dead connection (where it would read
/// the server's goodbye as its answer: a `FATAL` that may have come after a commit, so a lost answer for each
/// member of a batch).
#[tokio::test]
async fn a_commit_after_the_server_ended_the_idle_connection_is_answered() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else { return };
    let ids = ["warm1", "warm2", "alone", "blocker", "m1", "m2", "m3"];
    let store = store_with(&url, &ids.map(|id| (id, 1))).await;
    let fence = |id: &str| Commit::Fence { id: id.into(), epoch: 1, key: Some(format!("key-{id}")), guard: true };
    // Two held connections, idle.
    let (w1, w2) = (spawn_run(&store, fence("warm1")), spawn_run(&store, fence("warm2")));
    assert!(written(&w1.await.unwrap(), "warm1") && written(&w2.await.unwrap(), "warm2"));

    // The server ends every session of the database but this one, the held connections with the pool's.
    onceflow_tests::end_pg_sessions(&url).await;
    // Past `PING_IDLE`, the held connections are pinged when taken, and so are the pool's when lent to replace
    // them (`idle_connections.rs`).
    tokio::time::sleep(onceflow_engine::store::PING_IDLE + Duration::from_millis(300)).await;

    let alone = run(&store, fence("alone")).await;
    assert!(written(&alone, "alone"), "{alone:?}");
    let (release, blocked) = occupy_slot(&store, &url, "blocker").await;
    let before = store.group_commit_counts();
    let handles = ["m1", "m2", "m3"].map(|id| (id, spawn_run(&store, fence(id))));
    release_then_all_done(release, blocked, handles).await;
    let after = store.group_commit_counts();
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 3), "{before:?} → {after:?}");
}

/// A commit that reads the server's goodbye as its answer (its connection was ended while idle under
/// `PING_IDLE`, so not pinged) fails; that connection is not lent again, nor are the idle ones beside it (what
/// ended one, a restart, ended them all): the next commits are answered.
#[tokio::test]
async fn a_connection_that_said_goodbye_is_not_lent_again() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else { return };
    let ids = ["warm", "cut", "next", "then"];
    let store = store_with(&url, &ids.map(|id| (id, 1))).await;
    let fence = |id: &str| Commit::Fence { id: id.into(), epoch: 1, key: Some(format!("key-{id}")), guard: true };
    assert!(written(&run(&store, fence("warm")).await, "warm"));
    // Well under PING_IDLE after `warm` gave it back, the held connection is lent without a ping, and its commit
    // reads the goodbye (or finds the connection gone): nothing slow between the two.
    onceflow_tests::end_pg_sessions(&url).await;
    let cut = run(&store, fence("cut")).await;
    assert!(cut.is_err(), "{cut:?}");
    for id in ["next", "then"] {
        let outcome = run(&store, fence(id)).await;
        assert!(written(&outcome, id), "{id}: {outcome:?}");
    }
}

/// Two commits that wait for rows another transaction holds (an operator's open `UPDATE`, say) do not hold back
/// the process's other commits: each gives its slot back once it has held it `SLOT_HOLD`, and a commit that
/// comes after them, of another workflow, is written and answered while they still wait. With two slots both
/// are taken by commits sent alone; with one, the second waits in a drain's batch of one, which gives its slot
/// back alike.
#[tokio::test]
async fn commits_waiting_for_locked_rows_hold_up_no_other_commit() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else { return };
    for slots in [2, 1] {
        let store = PgStore::connect(&url, 16).await.unwrap().group_commit(slots);
        let [held1, held2, free] = ["held1", "held2", "free"].map(|id| format!("{id}-{slots}"));
        for id in [&held1, &held2, &free] {
            let mut conn = store.pool().acquire().await.unwrap();
            assert!(store.insert_workflow(&mut conn, &record(id, 1), &[]).await.unwrap());
        }
        let fence = |id: &str| Commit::Fence { id: id.into(), epoch: 1, key: None, guard: true };
        let (hold1, hold2) = (hold_row(&url, &held1).await, hold_row(&url, &held2).await);
        let (stuck1, stuck2) = (spawn_run(&store, fence(&held1)), spawn_run(&store, fence(&held2)));
        wait_for_lock_waits(&store, 2).await;
        let answered = tokio::time::timeout(Duration::from_secs(5), run(&store, fence(&free))).await;
        assert!(matches!(&answered, Ok(outcome) if done(outcome)), "{slots} slots, the free commit: {answered:?}");
        assert!(!stuck1.is_finished() && !stuck2.is_finished(), "the stuck commits wait for their rows");
        let (_, _) = (hold1.send(()), hold2.send(()));
        for stuck in [stuck1, stuck2] {
            let outcome = tokio::time::timeout(Duration::from_secs(20), stuck).await.unwrap().unwrap();
            assert!(done(&outcome), "{outcome:?}");
        }
    }
}

/// A batch whose member is cancelled (the role's `statement_timeout`, `pg_cancel_backend`) is refused whole, as
/// before, and its error's context — which Postgres logs and sends to the client — does not carry the member's
/// values (an idempotency token, say): the function raises the cancel again from its own line (migration 0060).
#[tokio::test]
async fn a_cancelled_batch_does_not_show_its_members_values() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else { return };
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("SET statement_timeout = '200ms'").execute(&mut conn).await.unwrap();
    let refused = sqlx::query(
        "SELECT * FROM onceflow_batch('0', ARRAY['onceflow_b0_sleep'], \
         ARRAY['(text) AS SELECT ARRAY[pg_sleep(2)::text, $1]'], ARRAY[1], ARRAY[1], ARRAY['tok_not_for_the_log'])",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap_err();
    let error = refused.as_database_error().unwrap().downcast_ref::<sqlx::postgres::PgDatabaseError>();
    assert_eq!(error.code(), "57014", "{error:?}");
    // Cancelled in the member's statement, and raised again from the function's own line.
    assert!(error.r#where().is_some_and(|w| w.contains("at RAISE")), "{error:?}");
    assert!(!format!("{error:?}").contains("tok_not_for_the_log"), "{error:?}");
}
