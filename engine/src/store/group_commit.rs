//! Group commit for SQLite's single writer: the one-call commits that queue while a transaction runs share the
//! next one, each inside a savepoint, so that a commit's fsync and page writes serve many workflows.
//!
//! A commit is answered only after the transaction holding it committed. One whose call fails (a check that
//! did not hold, or any error) is rolled back to its savepoint alone; a transaction whose `COMMIT` fails
//! answers every commit in it with that failure.

use std::sync::Arc;

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use tokio::sync::{mpsc, oneshot};

use super::held::Held;

/// The savepoint around each commit in a group: its SQL begins with `SAVEPOINT` and ends with `RELEASE` of it.
pub(crate) const SAVEPOINT: &str = "onceflow_commit";

/// Most commits one transaction takes.
const MAX_GROUP: usize = 32;

type Rows = std::result::Result<Vec<SqliteRow>, sqlx::Error>;

/// One commit waiting for its group.
struct Job {
    query: sqlx::query::Query<'static, Sqlite, SqliteArguments>,
    reply: oneshot::Sender<Rows>,
}

/// The queue of a store's group committer (a task that lives as long as the queue has senders).
#[derive(Debug, Clone)]
pub(crate) struct GroupCommit {
    jobs: mpsc::UnboundedSender<Job>,
}

impl GroupCommit {
    /// Starts the committer on `held`'s writer connection (inside a Tokio runtime).
    pub(crate) fn start(held: Arc<Held<Sqlite>>) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(run(held, queue));
        Self { jobs }
    }

    /// Runs `query` (wrapped in [`SAVEPOINT`]) in the next group; its rows once the group committed.
    pub(crate) async fn commit(&self, query: sqlx::query::Query<'static, Sqlite, SqliteArguments>) -> Rows {
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job { query, reply }).map_err(|_| sqlx::Error::PoolClosed)?;
        answer.await.map_err(|_| sqlx::Error::WorkerCrashed)?
    }
}

async fn run(held: Arc<Held<Sqlite>>, mut queue: mpsc::UnboundedReceiver<Job>) {
    while let Some(first) = queue.recv().await {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(&held, group).await;
    }
}

/// One transaction for `group`; answers each of its commits.
async fn commit_group(held: &Held<Sqlite>, group: Vec<Job>) {
    let mut writer = match held.get().await {
        Ok(writer) => writer,
        Err(e) => return fail(group.into_iter().map(|j| j.reply), &e.to_string()),
    };
    writer.set_open(true);
    let begun = sqlx::query("BEGIN IMMEDIATE").execute(&mut *writer).await;
    if let Err(e) = writer.check(begun) {
        // SQLite leaves no transaction open when `BEGIN` fails.
        writer.set_open(false);
        return fail(group.into_iter().map(|j| j.reply), &e.to_string());
    }
    let mut answers = Vec::with_capacity(group.len());
    let mut jobs = group.into_iter();
    while let Some(job) = jobs.next() {
        let rows = job.query.fetch_all(&mut *writer).await;
        let rows = writer.check(rows);
        if rows.is_err() {
            let undo = format!("ROLLBACK TO {SAVEPOINT}; RELEASE {SAVEPOINT}");
            let undone = sqlx::query(sqlx::AssertSqlSafe(undo)).execute(&mut *writer).await;
            if let Err(e) = writer.check(undone) {
                // This commit cannot be undone alone: none of the group is kept.
                let _ = sqlx::query("ROLLBACK").execute(&mut *writer).await;
                writer.set_open(false);
                let replies = answers.into_iter().map(|(reply, _)| reply);
                return fail(replies.chain([job.reply]).chain(jobs.map(|j| j.reply)), &e.to_string());
            }
        }
        answers.push((job.reply, rows));
    }
    let committed = sqlx::query("COMMIT").execute(&mut *writer).await;
    if let Err(e) = writer.check(committed) {
        let _ = sqlx::query("ROLLBACK").execute(&mut *writer).await;
        writer.set_open(false);
        return fail(answers.into_iter().map(|(reply, _)| reply), &e.to_string());
    }
    writer.set_open(false);
    drop(writer);
    for (reply, rows) in answers {
        let _ = reply.send(rows);
    }
}

/// Answers every commit in `replies` with a failure of their transaction.
fn fail(replies: impl Iterator<Item = oneshot::Sender<Rows>>, error: &str) {
    tracing::warn!(%error, "group commit failed");
    for reply in replies {
        let _ = reply.send(Err(sqlx::Error::Protocol(format!("group commit failed: {error}"))));
    }
}
