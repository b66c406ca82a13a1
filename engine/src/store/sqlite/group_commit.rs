//! Group commit for SQLite's single writer: the one-call commits that queue while a transaction runs share the
//! next one, so that a commit's page writes and its flush serve many workflows.
//!
//! The committer has a connection of its own, and takes the store's turn at writing (see `Held::turn`) for each
//! group, so that it writes between the single writes and closure transactions as before. A commit is answered
//! only after the transaction holding it committed and reached the disk: on a file database in WAL mode the
//! connection commits a group without flushing (`synchronous = NORMAL`) and the answers wait for the flush in
//! `durable.rs` while the next group runs; a group of one commit flushes in its own `COMMIT` (`FULL`) and is
//! answered at once, as a lone commit was before, with no hand-off to the flushing thread. The group first runs its commits one after another as they are; should one fail (a
//! check that did not hold, or any error), the transaction is rolled back and the group runs again with each
//! commit in a savepoint, where the one that fails is rolled back alone (the writer was held throughout, so the
//! others find what they found the first time). A savepoint costs a copy of each page a commit touches (SQLite's
//! sub-journal), which the common case, where every commit holds, does without. A group that fails otherwise
//! (its `BEGIN`, a rollback, its `COMMIT`) answers every commit in it with that failure and closes the connection,
//! which rolls back whatever it left open; the next group opens another.

use std::sync::Arc;

use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteRow};
use sqlx::{ConnectOptions, Connection, SqlSafeStr, Sqlite, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::PHASE_FLAGS;
use super::durable::Durable;
use crate::store::held::Held;

/// The savepoint around each commit of a group that runs again.
const SAVEPOINT: &str = "onceflow_commit";

/// Most commits one transaction takes.
const MAX_GROUP: usize = 32;

/// Statements the committer's connection keeps prepared.
const STATEMENT_CACHE: usize = 500;

/// A group's `BEGIN`, sent with its first commit; with the flush its `COMMIT` is to make before it, where the
/// connection last made the other.
const BEGIN: &str = "BEGIN IMMEDIATE;\n";
const BEGIN_FLUSHED: &str = "PRAGMA synchronous = FULL;\nBEGIN IMMEDIATE;\n";
const BEGIN_UNFLUSHED: &str = "PRAGMA synchronous = NORMAL;\nBEGIN IMMEDIATE;\n";

type Rows = std::result::Result<Vec<SqliteRow>, sqlx::Error>;

/// One commit waiting for its group.
struct Job {
    sql: Arc<str>,
    args: SqliteArguments,
    reply: oneshot::Sender<Rows>,
}

/// How a commit's SQL is sent within its group.
#[derive(Debug, Clone, Copy)]
enum Sent {
    /// As it is, the group's `BEGIN` (one of [`BEGIN`]…) before the first and its `COMMIT` after the last, so
    /// that neither costs a call to the writer's thread of its own.
    Plain { begin: Option<&'static str>, last: bool },
    /// Inside [`SAVEPOINT`], in a group that runs again.
    Savepoint,
}

impl Job {
    /// The commit's query, sent so.
    fn query(&self, sent: Sent) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
        let sql = match sent {
            Sent::Plain { begin: None, last: false } => sqlx::AssertSqlSafe(self.sql.clone()).into_sql_str(),
            Sent::Plain { begin, last } => {
                let commit = if last { ";\nCOMMIT" } else { "" };
                sqlx::AssertSqlSafe(format!("{}{}{commit}", begin.unwrap_or_default(), self.sql)).into_sql_str()
            }
            Sent::Savepoint => {
                sqlx::AssertSqlSafe(format!("SAVEPOINT {SAVEPOINT};\n{};\nRELEASE {SAVEPOINT}", self.sql))
                    .into_sql_str()
            }
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
    /// Starts the committer (inside a Tokio runtime): its connection opened with `options` when first needed, its
    /// turns taken at `held`.
    pub(crate) fn start(held: Arc<Held<Sqlite>>, options: SqliteConnectOptions) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        let committer = Committer { held, options, conn: None, durable: None, flushes: None };
        tokio::spawn(committer.run(queue));
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

/// The committer task's state.
struct Committer {
    held: Arc<Held<Sqlite>>,
    options: SqliteConnectOptions,
    /// Its connection, open between groups (none before the first and after one that failed).
    conn: Option<SqliteConnection>,
    /// The flushing thread, once a connection found a WAL file to flush.
    durable: Option<Durable<Vec<SqliteRow>>>,
    /// Whether the connection's `COMMIT` flushes (`synchronous = FULL`), as far as known.
    flushes: Option<bool>,
}

impl Committer {
    async fn run(mut self, mut queue: mpsc::UnboundedReceiver<Job>) {
        while let Some(first) = queue.recv().await {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match queue.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            self.commit_group(group).await;
        }
    }

    /// One transaction for `group`, at the store's turn; answers each of its commits once it is on disk.
    async fn commit_group(&mut self, group: Vec<Job>) {
        if self.durable.as_ref().is_some_and(Durable::failed) {
            let why = "a flush of the WAL failed: nothing is committed until the process restarts";
            return fail(group, why);
        }
        let Ok(turn) = self.held.turn().await else {
            return fail(group, "the store is closed");
        };
        let conn = match self.conn.take() {
            Some(conn) => Ok(conn),
            None => connect(&self.options, &mut self.durable).await,
        };
        let mut conn = match conn {
            Ok(conn) => conn,
            Err(e) => return fail(group, &e.to_string()),
        };
        // A lone commit is flushed by its own `COMMIT` and answered at once: no hand-off to the flushing thread,
        // so a lone payment waits no longer than it did. A group's flush is left to the thread.
        let flushed = group.len() == 1 || self.durable.is_none();
        let begin = match (&self.durable, self.flushes) {
            (None, _) => BEGIN,
            (Some(_), known) if known == Some(flushed) => BEGIN,
            (Some(_), _) if flushed => BEGIN_FLUSHED,
            (Some(_), _) => BEGIN_UNFLUSHED,
        };
        let (answers, at_once) = match run_group(&mut conn, &group, begin).await {
            Ok(answers) => answers,
            Err(e) => {
                // Closed at its turn, which rolls back what it left open, before anyone else writes.
                let _ = conn.close().await;
                return fail(group, &e.to_string());
            }
        };
        // Where the group ran again in savepoints, whether its first call's pragma ran is not known: the next
        // group sends its own, and this one's answers wait for the thread's flush.
        self.flushes = at_once.then_some(flushed);
        self.conn = Some(conn);
        drop(turn);
        let answers = group.into_iter().map(|j| j.reply).zip(answers).collect();
        match &self.durable {
            Some(durable) if !(flushed && at_once) => durable.answer(answers),
            _ => {
                for (reply, rows) in answers {
                    let _ = reply.send(rows);
                }
            }
        }
    }
}

/// The committer's connection: on a file database in WAL mode, one that commits without flushing, with the
/// thread that flushes (started once).
async fn connect(
    options: &SqliteConnectOptions,
    durable: &mut Option<Durable<Vec<SqliteRow>>>,
) -> Result<SqliteConnection, sqlx::Error> {
    // Its commits' statements (a few kinds, each sent as the first, the last, both or neither of a group, or in a
    // savepoint) stay prepared.
    let mut conn = options.clone().statement_cache_capacity(STATEMENT_CACHE).connect().await?;
    // Where statement phases note what their statements did (see `PHASE_FLAGS`); each phase empties it.
    let flags = format!("CREATE TEMP TABLE IF NOT EXISTS {PHASE_FLAGS} (flag TEXT PRIMARY KEY)");
    sqlx::query(sqlx::AssertSqlSafe(flags)).execute(&mut conn).await?;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&mut conn).await?;
    // A read, which opens the WAL file (making it if need be).
    sqlx::query("SELECT count(*) FROM sqlite_master").execute(&mut conn).await?;
    let file: Option<String> = sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
        .fetch_optional(&mut conn)
        .await?;
    if let Some(file) = file.filter(|f| !f.is_empty() && mode.eq_ignore_ascii_case("wal")) {
        // The WAL is opened for flushing before this connection commits anything, and while it is open the file
        // stays (SQLite deletes it when its last connection closes).
        let wal = Durable::<Vec<SqliteRow>>::open(std::path::Path::new(&file))?;
        match durable {
            Some(durable) => durable.reopened(wal),
            None => *durable = Some(Durable::start(wal)?),
        }
        sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut conn).await?;
    }
    Ok(conn)
}

/// Runs `group` in one transaction on `conn`, `begin` sent with the first commit: each commit's rows, or its error
/// where it was rolled back alone, and whether every call went through at once (no savepoints). An error is the
/// group's: nothing of it is kept (once `conn` is closed).
async fn run_group(
    conn: &mut SqliteConnection,
    group: &[Job],
    begin: &'static str,
) -> Result<(Vec<Rows>, bool), sqlx::Error> {
    let mut answers = Vec::with_capacity(group.len());
    let last = group.len().saturating_sub(1);
    let mut failed = None;
    for (i, job) in group.iter().enumerate() {
        let sent = Sent::Plain { begin: (i == 0).then_some(begin), last: i == last };
        match job.query(sent).fetch_all(&mut *conn).await {
            Ok(rows) => answers.push(Ok(rows)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let Some(failed) = failed else {
        // Committed by the last call.
        return Ok((answers, true));
    };
    // A commit failed, or the group's `BEGIN` or `COMMIT` did. Where SQLite ended the transaction itself (a
    // `BEGIN` that found the database busy, some failures of `COMMIT`) there is none to roll back: nothing of the
    // group was kept, and it fails with the first error. Else a lone commit is answered with its error, and a
    // group runs again, each commit in a savepoint.
    if sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err() {
        return Err(failed);
    }
    if group.len() == 1 {
        return Ok((vec![Err(failed)], false));
    }
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    answers.clear();
    for job in group {
        let rows = job.query(Sent::Savepoint).fetch_all(&mut *conn).await;
        if rows.is_err() {
            let undo = format!("ROLLBACK TO {SAVEPOINT}; RELEASE {SAVEPOINT}");
            sqlx::query(sqlx::AssertSqlSafe(undo)).execute(&mut *conn).await?;
        }
        answers.push(rows);
    }
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    Ok((answers, false))
}

/// Answers every commit of `group` with a failure of their transaction.
fn fail(group: Vec<Job>, error: &str) {
    tracing::warn!(%error, "group commit failed");
    for job in group {
        let _ = job.reply.send(Err(sqlx::Error::Protocol(format!("group commit failed: {error}"))));
    }
}
