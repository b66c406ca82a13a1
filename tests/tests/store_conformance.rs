//! The `Store` contract, run against every backend: what the engine relies on from each database.

use onceflow_engine::store::{
    Checkpoint, Committed, CompensationRecord, CompensationStatus, Cursor, Fence, Lease, Reopen, StepKind, StepRecord,
    StepStatus, WorkflowFilter, WorkflowRecord, WorkflowState, WorkflowUpdate, WorkflowWrite,
};
use onceflow_tests::{TestDb, on_every_backend};

fn workflow(id: &str, owner: Option<&str>, lease_expires_at: Option<i64>, next_attempt_at: i64) -> WorkflowRecord {
    WorkflowRecord {
        workflow_id: id.to_owned(),
        name: "t".to_owned(),
        input: "{}".to_owned(),
        input_hash: "h".to_owned(),
        state: WorkflowState::Running,
        output: None,
        error: None,
        lease_owner: owner.map(str::to_owned),
        lease_expires_at,
        lease_epoch: 1,
        next_attempt_at,
        notify: false,
        created_at: next_attempt_at,
        updated_at: next_attempt_at,
        tenant: None,
        trace: None,
    }
}

fn step_row(id: &str, key: &str, status: StepStatus, started_at: i64) -> StepRecord {
    StepRecord {
        workflow_id: id.to_owned(),
        step_key: key.to_owned(),
        step_name: key.to_owned(),
        kind: StepKind::Transactional,
        status,
        attempts: 1,
        output: Some("1".to_owned()),
        error: None,
        started_at,
        finished_at: Some(started_at),
        seq: None,
    }
}

async fn insert_is_unique<S: TestDb>(store: S) {
    let mut tx = store.begin().await.unwrap();
    assert!(store.insert_workflow(&mut tx, &workflow("w", Some("me"), Some(100), 0), &[]).await.unwrap());
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert!(!store.insert_workflow(&mut tx, &workflow("w", Some("you"), Some(100), 0), &[]).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(store.workflow("w").await.unwrap().unwrap().lease_owner.as_deref(), Some("me"));
    assert_eq!(store.workflow("nope").await.unwrap(), None);
}

/// A first commit inserts its workflow row with its steps; a second start's first commit finds the row and
/// reports a duplicate (the engine then rolls it back); a later commit is fenced by the epoch.
async fn persist_inserts_once_then_fences<S: TestDb>(store: S) {
    let row = workflow("w", Some("me"), Some(100), 0);
    let first = Checkpoint {
        workflow: WorkflowWrite::Insert(&row),
        steps: &[step_row("w", "a", StepStatus::Completed, 1)],
        compensations: None,
        leases_by_database: false,
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(store.persist(&mut tx, &first).await.unwrap(), Committed::Done { notify: false, outputs: vec![] });
    tx.commit().await.unwrap();
    let other = workflow("w", Some("you"), Some(100), 0);
    let second = Checkpoint {
        workflow: WorkflowWrite::Insert(&other),
        steps: &[step_row("w", "a", StepStatus::Failed, 1)],
        compensations: None,
        leases_by_database: false,
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(store.persist(&mut tx, &second).await.unwrap(), Committed::Duplicate);
    tx.rollback().await.unwrap();
    assert_eq!(store.workflow("w").await.unwrap().unwrap().lease_owner.as_deref(), Some("me"));
    assert_eq!(store.steps("w").await.unwrap()[0].status, StepStatus::Completed);
    let update = WorkflowUpdate { state: Some(WorkflowState::Completed), ..Default::default() };
    for (epoch, expected) in [(2, Committed::LeaseLost), (1, Committed::Done { notify: false, outputs: vec![] })] {
        let workflow = WorkflowWrite::Fence(Fence { workflow_id: "w", epoch, update: &update, now: 5 });
        let mut tx = store.begin().await.unwrap();
        let commit = Checkpoint { workflow, steps: &[], compensations: None, leases_by_database: false };
        let done = store.persist(&mut tx, &commit).await;
        assert_eq!(done.unwrap(), expected, "epoch {epoch}");
        tx.commit().await.unwrap();
    }
    assert_eq!(store.workflow("w").await.unwrap().unwrap().state, WorkflowState::Completed);
}

fn compensation(seq: i32, status: CompensationStatus) -> CompensationRecord {
    CompensationRecord {
        workflow_id: "w".to_owned(),
        seq,
        step_key: format!("step{seq}"),
        name: "undo".to_owned(),
        input: r#"{"note":"a \"quoted\" input"}"#.to_owned(),
        status,
    }
}

/// The compensation list is written with the workflow row: on its insert, then under the fence, whose lost
/// lease leaves it as it was; an operator's retry of the compensations registers the failed ones again.
async fn compensations_ride_with_the_workflow_row<S: TestDb>(store: S) {
    let row = workflow("w", Some("me"), Some(100), 0);
    let registered = [compensation(0, CompensationStatus::Registered), compensation(1, CompensationStatus::Registered)];
    let first = Checkpoint {
        workflow: WorkflowWrite::Insert(&row),
        steps: &[],
        compensations: Some(&registered),
        leases_by_database: false,
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(store.persist(&mut tx, &first).await.unwrap(), Committed::Done { notify: false, outputs: vec![] });
    tx.commit().await.unwrap();
    assert_eq!(store.compensations("w").await.unwrap(), registered);
    let update = WorkflowUpdate::default();
    let changed = [compensation(0, CompensationStatus::Done), compensation(1, CompensationStatus::Failed)];
    for (epoch, expected, stored) in
        [(2, Committed::LeaseLost, &registered), (1, Committed::Done { notify: false, outputs: vec![] }, &changed)]
    {
        let workflow = WorkflowWrite::Fence(Fence { workflow_id: "w", epoch, update: &update, now: 5 });
        let commit = Checkpoint { workflow, steps: &[], compensations: Some(&changed), leases_by_database: false };
        let mut tx = store.begin().await.unwrap();
        assert_eq!(store.persist(&mut tx, &commit).await.unwrap(), expected, "epoch {epoch}");
        if expected == Committed::LeaseLost {
            tx.rollback().await.unwrap();
        } else {
            tx.commit().await.unwrap();
        }
        assert_eq!(store.compensations("w").await.unwrap(), stored, "epoch {epoch}");
    }
    store.reopen("w", &[WorkflowState::Running], Reopen::Compensation, None, 9).await.unwrap().unwrap();
    let statuses: Vec<_> = store.compensations("w").await.unwrap().into_iter().map(|c| c.status).collect();
    assert_eq!(statuses, [CompensationStatus::Done, CompensationStatus::Registered]);
    assert!(store.compensations("missing").await.unwrap().is_empty());
}

async fn steps_upsert_by_key<S: TestDb>(store: S) {
    let mut tx = store.begin().await.unwrap();
    store.insert_workflow(&mut tx, &workflow("w", Some("me"), Some(100), 0), &[]).await.unwrap();
    store
        .write_steps(
            &mut tx,
            &[step_row("w", "a", StepStatus::Started, 1), step_row("w", "b", StepStatus::Completed, 2)],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    store.write_steps(&mut tx, &[step_row("w", "a", StepStatus::Completed, 1)]).await.unwrap();
    tx.commit().await.unwrap();
    let steps = store.steps("w").await.unwrap();
    let got: Vec<_> = steps.iter().map(|s| (s.step_key.as_str(), s.status)).collect();
    assert_eq!(got, [("a", StepStatus::Completed), ("b", StepStatus::Completed)]);
}

async fn the_fence_checks_the_epoch<S: TestDb>(store: S) {
    let mut tx = store.begin().await.unwrap();
    store.insert_workflow(&mut tx, &workflow("w", Some("me"), Some(100), 0), &[]).await.unwrap();
    tx.commit().await.unwrap();
    let done = WorkflowUpdate {
        state: Some(WorkflowState::Completed),
        output: Some("7".into()),
        release_until: Some(5),
        ..Default::default()
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(store.fence(&mut tx, "w", 2, &done, 5, None).await.unwrap(), None, "a stale epoch is refused");
    assert_eq!(store.fence(&mut tx, "w", 1, &done, 5, None).await.unwrap(), Some(false));
    tx.commit().await.unwrap();
    let row = store.workflow("w").await.unwrap().unwrap();
    assert_eq!((row.state, row.output.as_deref(), row.lease_owner), (WorkflowState::Completed, Some("7"), None));
}

async fn claims_only_due_and_unleased<S: TestDb>(store: S) {
    let mut tx = store.begin().await.unwrap();
    store.insert_workflow(&mut tx, &workflow("leased", Some("other"), Some(1_000), 0), &[]).await.unwrap();
    store.insert_workflow(&mut tx, &workflow("expired", Some("other"), Some(50), 0), &[]).await.unwrap();
    store.insert_workflow(&mut tx, &workflow("later", None, None, 5_000), &[]).await.unwrap();
    store.insert_workflow(&mut tx, &workflow("free", None, None, 10), &[]).await.unwrap();
    tx.commit().await.unwrap();
    let mut claimed: Vec<_> = store.claim_due("me", Lease::at(100, 100), 10).await.unwrap();
    claimed.sort_by(|a, b| a.workflow_id.cmp(&b.workflow_id));
    let got: Vec<_> = claimed.iter().map(|w| (w.workflow_id.as_str(), w.lease_epoch)).collect();
    assert_eq!(got, [("expired", 2), ("free", 2)]);
    assert!(claimed.iter().all(|w| w.lease_owner.as_deref() == Some("me") && w.lease_expires_at == Some(200)));
    assert!(store.claim_due("you", Lease::at(150, 150), 10).await.unwrap().is_empty(), "held leases are not claimed");
    assert_eq!(store.heartbeat("me", &["expired".into(), "free".into()], Lease::at(150, 250)).await.unwrap(), 2);
    assert!(store.claim_due("you", Lease::at(300, 200), 10).await.unwrap().is_empty(), "the heartbeat extended them");
    assert!(!store.release("free", 1, 0, 300).await.unwrap(), "release checks the epoch");
    assert!(store.release("free", 2, 0, 300).await.unwrap());
    assert_eq!(store.claim_due("you", Lease::at(300, 200), 10).await.unwrap().len(), 1);
    assert_eq!(store.release_all("me", 300).await.unwrap(), 1);
    assert_eq!(store.claim_due("you", Lease::at(300, 200), 10).await.unwrap()[0].workflow_id, "expired");
}

/// With `by_database`, leases are judged by the database's clock whatever the caller's says: a caller an hour
/// ahead takes no lease that has not ended by the database's clock, one an hour behind extends none that has, and
/// a first commit moves the lease its (late) clock gave onto the database's clock. Due-ness stays the caller's.
async fn leases_are_judged_by_the_databases_clock<S: TestDb>(store: S) {
    const HOUR: i64 = 3_600_000;
    let real = onceflow_engine::clock::Clock::now_ms(&onceflow_engine::clock::SystemClock);
    let mut tx = store.begin().await.unwrap();
    store.insert_workflow(&mut tx, &workflow("live", Some("other"), Some(real + 60_000), 0), &[]).await.unwrap();
    store.insert_workflow(&mut tx, &workflow("over", Some("other"), Some(real - 1_000), 0), &[]).await.unwrap();
    store.insert_workflow(&mut tx, &workflow("mine", Some("me"), Some(real - 1_000), 0), &[]).await.unwrap();
    tx.commit().await.unwrap();
    let ahead = Lease { now: real + HOUR, length_ms: 10_000, by_database: true };
    let mut claimed: Vec<_> = store.claim_due("me", ahead, 10).await.unwrap();
    claimed.sort_by(|a, b| a.workflow_id.cmp(&b.workflow_id));
    let got: Vec<_> = claimed.iter().map(|w| w.workflow_id.as_str()).collect();
    assert_eq!(got, ["mine", "over"], "the live lease is not taken");
    let lease = claimed[1].lease_expires_at.unwrap();
    assert!((real + 9_000..real + 20_000).contains(&lease), "leased by the database's clock: {lease} vs {real}");
    let live = store.claim("live", "me", ahead).await.unwrap();
    assert_eq!(live, None, "a wake takes no live lease either");

    let behind = Lease { now: real - HOUR, length_ms: 10_000, by_database: true };
    let mut tx = store.begin().await.unwrap();
    store.insert_workflow(&mut tx, &workflow("ended", Some("me"), Some(real - 1_000), 0), &[]).await.unwrap();
    tx.commit().await.unwrap();
    let ids = ["over".to_owned(), "ended".to_owned()];
    assert_eq!(store.heartbeat("me", &ids, behind).await.unwrap(), 1, "only the lease not yet over is extended");
    let extended = store.workflow("over").await.unwrap().unwrap().lease_expires_at.unwrap();
    assert!((real + 9_000..real + 20_000).contains(&extended), "{extended} vs {real}");
    assert_eq!(store.workflow("ended").await.unwrap().unwrap().lease_expires_at, Some(real - 1_000));

    let late =
        WorkflowRecord { created_at: real - HOUR, ..workflow("late", Some("me"), Some(real - HOUR + 10_000), 0) };
    let first = Checkpoint {
        workflow: WorkflowWrite::Insert(&late),
        steps: &[],
        compensations: None,
        leases_by_database: true,
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(store.persist(&mut tx, &first).await.unwrap(), Committed::Done { notify: false, outputs: vec![] });
    tx.commit().await.unwrap();
    let inserted = store.workflow("late").await.unwrap().unwrap().lease_expires_at.unwrap();
    assert!((real + 9_000..real + 20_000).contains(&inserted), "moved onto the database's clock: {inserted}");
    let taken = store.claim_due("you", Lease { now: real, ..ahead }, 10).await.unwrap();
    assert!(taken.iter().all(|w| w.workflow_id != "late"), "the late starter's lease is live: {taken:?}");
}

async fn lists_notifies_and_reopens<S: TestDb>(store: S) {
    let mut tx = store.begin().await.unwrap();
    store.insert_workflow(&mut tx, &workflow("one", Some("me"), Some(100), 1), &[]).await.unwrap();
    store.insert_workflow(&mut tx, &workflow("two", Some("me"), Some(100), 2), &[]).await.unwrap();
    tx.commit().await.unwrap();
    let ids = |page: Vec<WorkflowRecord>| page.into_iter().map(|w| w.workflow_id).collect::<Vec<_>>();
    let all = ids(store.list(WorkflowFilter::default(), 10).await.unwrap());
    assert_eq!(all, ["two", "one"], "newest first");
    let before = Cursor::before_time(2);
    let older = WorkflowFilter { state: Some(WorkflowState::Running), after: Some(&before), ..Default::default() };
    assert_eq!(ids(store.list(older, 10).await.unwrap()), ["one"]);
    let failed = WorkflowFilter { state: Some(WorkflowState::Failed), ..Default::default() };
    assert!(store.list(failed, 10).await.unwrap().is_empty());
    assert!(store.request_notify("one").await.unwrap().unwrap().notify);
    let cancelled =
        store.reopen("one", &[WorkflowState::Running], Reopen::Cancel, Some("{}".into()), 9).await.unwrap().unwrap();
    assert_eq!((cancelled.state, cancelled.lease_epoch, cancelled.lease_owner), (WorkflowState::Compensating, 2, None));
    assert_eq!(store.reopen("one", &[WorkflowState::Running], Reopen::Cancel, None, 9).await.unwrap(), None);
    assert!(store.reopen("missing", &[WorkflowState::Running], Reopen::Cancel, None, 9).await.is_err());
}

/// Statuses are stored as the texts older versions wrote and read (SQL that names them as literals finds them),
/// and rows with those texts read back; a state this version does not know is an error, never a default.
async fn statuses_are_stored_as_their_text<S: TestDb>(store: S) {
    let mut tx = store.begin().await.unwrap();
    store.insert_workflow(&mut tx, &workflow("w", Some("me"), Some(100), 0), &[]).await.unwrap();
    store.write_steps(&mut tx, &[step_row("w", "a", StepStatus::Retrying, 1)]).await.unwrap();
    let update = WorkflowUpdate { state: Some(WorkflowState::CompensationFailed), ..Default::default() };
    assert_eq!(store.fence(&mut tx, "w", 1, &update, 5, None).await.unwrap(), Some(false));
    tx.commit().await.unwrap();
    let found = |sql| store.execute(sql, "w");
    let row = "UPDATE workflows SET notify = notify WHERE workflow_id = $1 AND state = 'compensation_failed'";
    assert_eq!(found(row).await.unwrap(), 1);
    let step = "UPDATE workflow_steps SET attempts = attempts \
        WHERE workflow_id = $1 AND kind = 'transactional' AND status = 'retrying'";
    assert_eq!(found(step).await.unwrap(), 1);
    found("UPDATE workflows SET state = 'cancelled' WHERE workflow_id = $1").await.unwrap();
    assert_eq!(store.workflow("w").await.unwrap().unwrap().state, WorkflowState::Cancelled);
    assert_eq!(store.count_by_state().await.unwrap(), [(WorkflowState::Cancelled, 1)]);
    found("UPDATE workflows SET state = 'paused' WHERE workflow_id = $1").await.unwrap();
    assert!(store.workflow("w").await.is_err(), "an unknown state does not decode");
    assert!(store.count_by_state().await.is_err());
}

on_every_backend!(
    persist_inserts_once_then_fences,
    insert_is_unique,
    steps_upsert_by_key,
    the_fence_checks_the_epoch,
    claims_only_due_and_unleased,
    leases_are_judged_by_the_databases_clock,
    lists_notifies_and_reopens,
    compensations_ride_with_the_workflow_row,
    statuses_are_stored_as_their_text,
);
