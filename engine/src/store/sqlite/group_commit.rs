//! Group commit for SQLite's single writer: the one-call commits that queue while a transaction runs share the
//! next one, so that a commit's fsync and page writes serve many workflows.
//!
//! A commit is answered only after the transaction holding it committed. The group first runs its commits one
//! after another as they are; should one fail (a check that did not hold, or any error), the transaction is
//! rolled back and the group runs again with each commit in a savepoint, where the one that fails is rolled
//! back alone (the writer was held throughout, so the others find what they found the first time). A
//! savepoint costs a copy of each page a commit touches (SQLite's sub-journal), which the common case, where
//! every commit holds, does without. A transaction whose `COMMIT` fails answers every commit in it with that
//! failure.

use std::sync::Arc;

use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{SqlSafeStr, Sqlite};
use tokio::sync::{mpsc, oneshot};

use crate::store::held::{Held, Writer};

/// The savepoint around each commit of a group that runs again.
const SAVEPOINT: &str = "onceflow_commit";

/// Most commits one transaction takes.
const MAX_GROUP: usize = 32;

type Rows = std::result::Result<Vec<SqliteRow>, sqlx::Error>;

/// One commit waiting for its group.
struct Job {
    sql: Arc<str>,
    args: SqliteArguments,
    reply: oneshot::Sender<Rows>,
}

impl Job {
    /// The commit's query, as it is or inside [`SAVEPOINT`].
    fn query(&self, savepoint: bool) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
        let sql = if savepoint {
            sqlx::AssertSqlSafe(format!("SAVEPOINT {SAVEPOINT};\n{};\nRELEASE {SAVEPOINT}", self.sql)).into_sql_str()
        } else {
            sqlx::AssertSqlSafe(self.sql.clone()).into_sql_str()
        };
        sqlx::query_with(sql, self.args.clone())
    }
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

    /// Runs `query` (which must not end or roll back the transaction) in the next group; its rows once the
    /// group committed.
    pub(crate) async fn commit(&self, mut query: sqlx::query::Query<'static, Sqlite, SqliteArguments>) -> Rows {
        use sqlx::Execute;
        let args = query.take_arguments().map_err(sqlx::Error::Encode)?.unwrap_or_default();
        let (reply, answer) = oneshot::channel();
        let sql = Arc::from(query.sql().as_str());
        self.jobs.send(Job { sql, args, reply }).map_err(|_| sqlx::Error::PoolClosed)?;
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
    if let Err(e) = begin(&mut writer).await {
        return fail(group.into_iter().map(|j| j.reply), &e.to_string());
    }
    let mut answers = Vec::with_capacity(group.len());
    for job in &group {
        let rows = job.query(false).fetch_all(&mut *writer).await;
        match writer.check(rows) {
            Ok(rows) => answers.push(Ok(rows)),
            Err(_) => break,
        }
    }
    if answers.len() < group.len() {
        // One failed: run the group again, each commit in a savepoint. (Were the transaction not rolled back,
        // the connection is closed when dropped, which rolls it back.)
        let rolled_back = sqlx::query("ROLLBACK").execute(&mut *writer).await;
        if let Err(e) = writer.check(rolled_back) {
            return fail(group.into_iter().map(|j| j.reply), &e.to_string());
        }
        writer.set_open(false);
        if let Err(e) = begin(&mut writer).await {
            return fail(group.into_iter().map(|j| j.reply), &e.to_string());
        }
        answers.clear();
        for job in &group {
            let rows = job.query(true).fetch_all(&mut *writer).await;
            let rows = writer.check(rows);
            if rows.is_err() {
                let undo = format!("ROLLBACK TO {SAVEPOINT}; RELEASE {SAVEPOINT}");
                let undone = sqlx::query(sqlx::AssertSqlSafe(undo)).execute(&mut *writer).await;
                if let Err(e) = writer.check(undone) {
                    // This commit cannot be undone alone: none of the group is kept.
                    let _ = sqlx::query("ROLLBACK").execute(&mut *writer).await;
                    writer.set_open(false);
                    return fail(group.into_iter().map(|j| j.reply), &e.to_string());
                }
            }
            answers.push(rows);
        }
    }
    let committed = sqlx::query("COMMIT").execute(&mut *writer).await;
    if let Err(e) = writer.check(committed) {
        let _ = sqlx::query("ROLLBACK").execute(&mut *writer).await;
        writer.set_open(false);
        return fail(group.into_iter().map(|j| j.reply), &e.to_string());
    }
    writer.set_open(false);
    drop(writer);
    for (job, rows) in group.into_iter().zip(answers) {
        let _ = job.reply.send(rows);
    }
}

/// `BEGIN IMMEDIATE` on the writer, marked open until the group ends; after a failure no transaction is open
/// (SQLite leaves none).
async fn begin(writer: &mut Writer<'_, Sqlite>) -> Result<(), sqlx::Error> {
    writer.set_open(true);
    let begun = sqlx::query("BEGIN IMMEDIATE").execute(&mut **writer).await;
    let begun = writer.check(begun);
    if begun.is_err() {
        writer.set_open(false);
    }
    begun.map(drop)
}

/// Answers every commit in `replies` with a failure of their transaction.
fn fail(replies: impl Iterator<Item = oneshot::Sender<Rows>>, error: &str) {
    tracing::warn!(%error, "group commit failed");
    for reply in replies {
        let _ = reply.send(Err(sqlx::Error::Protocol(format!("group commit failed: {error}"))));
    }
}
