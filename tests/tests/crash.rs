//! Real process crashes: a worker process is killed with SIGKILL at a point inside the workflow, a second
//! process resumes it, and every transactional step's effect is present exactly once.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use onceflow_engine::store::WorkflowState;
use onceflow_engine::{MySqlStore, PgStore, SqliteStore};
use onceflow_tests::TestDb;

const WORKER: &str = env!("CARGO_BIN_EXE_crash-worker");

/// Runs a worker until it prints `reached <point>`, then kills it with SIGKILL.
fn kill_at(url: &str, id: &str, point: &str) {
    let mut child =
        Command::new(WORKER).args([url, id, "400", point]).stdout(Stdio::piped()).spawn().expect("start the worker");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = lines.next().expect("the worker printed").expect("a line");
    assert_eq!(line, format!("reached {point}"));
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
}

/// Runs a worker that resumes `id` to its end; returns what it printed.
fn resume(url: &str, id: &str) -> String {
    let started = Instant::now();
    let out = Command::new(WORKER).args([url, id, "400"]).output().expect("run the worker");
    assert!(out.status.success(), "resuming worker failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(30));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn check<S: TestDb>(store: &S, id: &str) {
    let row = store.workflow(id).await.unwrap().expect("workflow");
    assert_eq!(row.state, WorkflowState::Completed, "{id}");
    assert_eq!(store.effects(id).await.unwrap(), ["a", "b", "c"], "{id}: every effect exactly once");
}

fn crash_matrix(url: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for point in ["e1", "b", "e2"] {
        let id = format!("killed-at-{point}");
        kill_at(url, &id, point);
        let printed = resume(url, &id);
        assert!(printed.contains("outcome Some(Completed(String(\"done:x\")))"), "{printed}");
        ids.push(id);
    }
    ids
}

/// Runs the crash matrix against `url` in worker processes, then checks every workflow through `store`.
async fn crash_and_check<S: TestDb>(url: String, store: impl std::future::Future<Output = onceflow_engine::Result<S>>) {
    let ids = tokio::task::spawn_blocking(move || crash_matrix(&url)).await.unwrap();
    let store = store.await.unwrap();
    for id in ids {
        check(&store, &id).await;
    }
}

#[tokio::test]
async fn sigkill_then_resume_on_sqlite() {
    let path = std::env::temp_dir().join(format!("onceflow-crash-{}.db", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", path.display());
    crash_and_check(url.clone(), async move { SqliteStore::connect(&url).await }).await;
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test]
async fn sigkill_then_resume_on_postgres() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    crash_and_check(url.clone(), async move { PgStore::connect(&url, 2).await }).await;
}

#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test]
async fn sigkill_then_resume_on_mysql() {
    let Some(url) = onceflow_tests::mysql_url().await.unwrap() else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    crash_and_check(url.clone(), async move { MySqlStore::connect(&url, 2).await }).await;
}
