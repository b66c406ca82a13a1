//! Liveness of leases, each on SQLite, Postgres and MySQL: a process heartbeats only the workflows a live task of
//! its own drives, so a run that stopped (here: panicked) lets its lease expire and the workflow is resumed by
//! another process (or this one) while the process that lost it keeps running.

use onceflow_engine::{WorkflowRecord, state};
use onceflow_tests::{TestDb, on_every_backend};

fn leased(id: &str, owner: &str, lease_expires_at: i64, state: &str) -> WorkflowRecord {
    WorkflowRecord {
        workflow_id: id.to_owned(),
        name: "t".to_owned(),
        input: "{}".to_owned(),
        input_hash: "h".to_owned(),
        state: state.to_owned(),
        output: None,
        error: None,
        lease_owner: Some(owner.to_owned()),
        lease_expires_at: Some(lease_expires_at),
        lease_epoch: 1,
        next_attempt_at: 0,
        notify: false,
        created_at: 0,
        updated_at: 0,
    }
}

/// The store's heartbeat extends only the listed workflows that `owner` still holds, unexpired and unfinished;
/// the other leases of `owner` (runs that stopped) are left to expire.
async fn the_heartbeat_extends_only_the_listed_leases<S: TestDb>(store: S) {
    let rows = [
        leased("driven", "me", 1_000, state::RUNNING),
        leased("compensating", "me", 1_000, state::COMPENSATING),
        leased("stopped", "me", 1_000, state::RUNNING),
        leased("theirs", "other", 1_000, state::RUNNING),
        leased("expired", "me", 50, state::RUNNING),
        leased("done", "me", 1_000, state::COMPLETED),
    ];
    let mut tx = store.begin().await.unwrap();
    for row in &rows {
        store.insert_workflow(&mut tx, row, &[]).await.unwrap();
    }
    tx.commit().await.unwrap();
    assert_eq!(store.heartbeat("me", &[], 2_000, 100).await.unwrap(), 0);
    // More ids than one MySQL statement lists, most of them not in the table.
    let mut ids: Vec<String> = (0..1_200).map(|i| format!("absent-{i}")).collect();
    ids.extend(["driven", "theirs", "expired", "done"].map(String::from));
    ids.insert(600, "compensating".to_owned());
    assert_eq!(store.heartbeat("me", &ids, 2_000, 100).await.unwrap(), 2);
    let expected = [2_000, 2_000, 1_000, 1_000, 50, 1_000];
    for (row, expected) in rows.iter().zip(expected) {
        let stored = store.workflow(&row.workflow_id).await.unwrap().unwrap();
        assert_eq!(stored.lease_expires_at, Some(expected), "{}", row.workflow_id);
    }
}

on_every_backend!(the_heartbeat_extends_only_the_listed_leases);
