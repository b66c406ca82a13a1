//! Group commit on Postgres: one-statement commits of different workflows that arrive while every commit slot
//! is busy are gathered and sent together, in one transaction, each under a savepoint of its own.
//!
//! A commit takes a free slot and runs alone at once, as before (a lone payment never waits for company).
//! Commits that find every slot busy queue; the slot that frees first takes the queue (up to a batch) and sends
//! it as `BEGIN`, then per member a savepoint and its statement, then one `COMMIT`: one WAL flush and one commit
//! for the batch instead of one per payment. The gathering window is thus the time the slots are busy, never a
//! timer.
//!
//! Each member's statement carries its own fence (lease epoch), guards and unique keys, checked by its own
//! `onceflow_check` calls. A member whose statement raises — a check, a duplicate, a lock it waited for too long
//! (the batch sets a short `lock_timeout`, so that a member waiting on another transaction cannot hold the
//! batch), any database error — is rolled back to its savepoint: nothing of it stays, the others go on. A check's
//! outcome is the member's answer once the batch has committed (what it saw is then what is committed); any other
//! error is answered by running the member again alone after the batch, exactly as it would have run without
//! batching. Answers are given only after the `COMMIT`: if the batch cannot begin or its `COMMIT` is refused, every
//! member runs alone; if the connection fails once the `COMMIT` was sent, whether it committed is unknown, and
//! every member gets the error a lone commit would have had (the engine treats it as such).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Executor, SqlStr};
use tokio::sync::oneshot;

use super::PgStore;
use crate::error::Result;
use crate::store::{Store, common};

/// The most members of a batch: each savepoint that writes takes a subtransaction id, and past 64 of them in one
/// transaction Postgres's snapshots slow down for every session.
const _: () = assert!(super::MAX_BATCH < 64);

/// How long a batch member waits for a row lock before it leaves the batch to run alone.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '20ms'";

/// The statement result a commit gets back: its row, or the database's refusal.
pub(super) type Answer = std::result::Result<PgRow, sqlx::Error>;

/// One commit's statement: its SQL and arguments, prepared and cached per connection like any query.
pub(super) struct Statement {
    sql: SqlStr,
    args: PgArguments,
}

impl Statement {
    /// The statement of `query`, its arguments taken out.
    pub(super) fn of(mut query: super::rows::PgQuery<'_>) -> Result<Self> {
        use sqlx::Execute;
        let args = query.take_arguments().map_err(sqlx::Error::Encode)?.unwrap_or_default();
        Ok(Self { sql: query.sql(), args })
    }

    /// The query, to send once.
    fn into_query(self) -> super::rows::PgQuery<'static> {
        sqlx::query_with(self.sql, self.args)
    }

    /// The query, keeping the statement for another try (a batch may be sent twice, then a member alone).
    fn query(&self) -> super::rows::PgQuery<'static> {
        sqlx::query_with(self.sql.clone(), self.args.clone())
    }
}

/// A commit waiting in the queue, and where its answer goes.
struct Member {
    statement: Statement,
    reply: oneshot::Sender<Result<Answer>>,
}

/// The group commit's slots and queue (see the module).
#[derive(Debug)]
pub(super) struct GroupCommit {
    slots: usize,
    max_batch: usize,
    state: Mutex<State>,
    /// Batches sent, and the commits they held.
    batches: AtomicU64,
    members: AtomicU64,
}

#[derive(Default)]
struct State {
    busy: usize,
    queue: VecDeque<Member>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("busy", &self.busy).field("queued", &self.queue.len()).finish()
    }
}

/// A slot taken: released on drop, or handed to a task that drains the queue when commits wait.
struct Slot(PgStore);

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(group) = self.0.group.clone() else { return };
        let Ok(mut s) = group.state.lock() else { return };
        // Decided under the lock: a commit queued after this look finds the slot still busy and is drained.
        if !s.queue.is_empty()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let store = self.0.clone();
            runtime.spawn(async move { drain(store).await });
            return;
        }
        s.busy = s.busy.saturating_sub(1);
    }
}

impl GroupCommit {
    /// Up to `slots` commits (or batches) at once, batches of up to `max_batch` members.
    pub(super) fn new(slots: usize, max_batch: usize) -> Self {
        Self {
            slots: slots.max(1),
            max_batch: max_batch.max(1),
            state: Mutex::new(State::default()),
            batches: AtomicU64::new(0),
            members: AtomicU64::new(0),
        }
    }

    /// Batches sent so far, and the commits they held.
    pub(super) fn counts(&self) -> (u64, u64) {
        (self.batches.load(Ordering::Relaxed), self.members.load(Ordering::Relaxed))
    }

    /// The next batch of the queue, or `None` (and the slot given back) when it is empty.
    fn next_batch(&self) -> Option<Vec<Member>> {
        let mut s = self.state.lock().ok()?;
        if s.queue.is_empty() {
            s.busy = s.busy.saturating_sub(1);
            return None;
        }
        let n = s.queue.len().min(self.max_batch);
        Some(s.queue.drain(..n).collect())
    }
}

/// Runs `statement` as a commit of its own, or in a batch with others when every slot is busy.
pub(super) async fn commit(store: &PgStore, statement: Statement) -> Result<Answer> {
    let Some(group) = store.group.as_ref() else { return alone(store, statement).await };
    let waiting = {
        let mut s = group.state.lock().map_err(|_| poisoned())?;
        if s.busy < group.slots {
            s.busy += 1;
            Err(statement)
        } else {
            let (reply, answer) = oneshot::channel();
            s.queue.push_back(Member { statement, reply });
            Ok(answer)
        }
    };
    match waiting {
        // A member's answer is always sent; a dropped sender means the runtime is shutting down.
        Ok(answer) => answer.await.map_err(|_| sqlx::Error::PoolClosed)?,
        Err(statement) => {
            let _slot = Slot(store.clone());
            alone(store, statement).await
        }
    }
}

fn poisoned() -> sqlx::Error {
    sqlx::Error::Protocol("the group commit's state is poisoned".into())
}

/// One statement in autocommit on a writer connection: the commit without batching.
async fn alone(store: &PgStore, statement: Statement) -> Result<Answer> {
    let mut conn = store.writer().await?;
    let row = statement.into_query().fetch_one(&mut *conn).await;
    match conn.check(row) {
        Ok(row) => Ok(Ok(row)),
        Err(e @ sqlx::Error::Database(_)) => Ok(Err(e)),
        Err(e) => Err(e.into()),
    }
}

/// Sends the queue's batches on a slot until the queue is empty.
async fn drain(store: PgStore) {
    let Some(group) = store.group.clone() else { return };
    let mut draining = Draining { group: group.clone(), done: false };
    while let Some(batch) = group.next_batch() {
        if let [_] = batch.as_slice() {
            for m in batch {
                let answer = alone(&store, m.statement).await;
                let _ = m.reply.send(answer);
            }
        } else {
            batch_commit(&store, batch).await;
        }
    }
    // `next_batch` gave the slot back when it found the queue empty.
    draining.done = true;
}

/// A drain under way: if it ends otherwise than by finding the queue empty (a panic, its task dropped), its slot
/// is given back, so that the next commit takes it and drains what is queued.
struct Draining {
    group: std::sync::Arc<GroupCommit>,
    done: bool,
}

impl Drop for Draining {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Ok(mut s) = self.group.state.lock() {
            s.busy = s.busy.saturating_sub(1);
        }
    }
}

/// What became of a member in its batch.
enum Outcome {
    /// Its statement ran: its row, or the refusal of one of its checks (final once the batch commits).
    Ran(Answer),
    /// Its statement failed otherwise and was rolled back: it runs again alone.
    Alone,
}

/// Sends `batch` in one transaction (see the module) and answers each member.
async fn batch_commit(store: &PgStore, batch: Vec<Member>) {
    if let Some(group) = &store.group {
        group.batches.fetch_add(1, Ordering::Relaxed);
        group.members.fetch_add(batch.len() as u64, Ordering::Relaxed);
    }
    // First as it is, without savepoints (one round trip per member); if a member fails, the batch is rolled
    // back and sent again with each member under a savepoint, where it is rolled back alone.
    let outcomes = match in_one_transaction(store, &batch, false).await {
        Ok(outcomes) => Ok(outcomes),
        Err(Unsent) => in_one_transaction(store, &batch, true).await,
    };
    let outcomes = match outcomes {
        Ok(outcomes) => outcomes,
        // Nothing was committed: every member runs alone.
        Err(Unsent) => batch.iter().map(|_| Outcome::Alone).collect(),
    };
    // The members whose outcome is known are answered first; each of the others runs alone in a task of its own,
    // so that one waiting for a row lock (why most leave a batch) holds neither the slot nor the rest.
    for (m, outcome) in batch.into_iter().zip(outcomes) {
        match outcome {
            Outcome::Ran(answer) => {
                let _ = m.reply.send(Ok(answer));
            }
            Outcome::Alone => {
                let store = store.clone();
                tokio::spawn(async move {
                    let answer = alone(&store, m.statement).await;
                    let _ = m.reply.send(answer);
                });
            }
        }
    }
}

/// The batch did not commit, surely: nothing of it is in the database.
struct Unsent;

/// The batch's transaction: each member's outcome once committed; `Err(Unsent)` when it surely did not commit;
/// every member that ran answered an error when the `COMMIT`'s outcome is unknown.
///
/// Without `savepoints`, a member that fails rolls the whole batch back (`Err(Unsent)`).
async fn in_one_transaction(
    store: &PgStore,
    batch: &[Member],
    savepoints: bool,
) -> std::result::Result<Vec<Outcome>, Unsent> {
    let mut conn = store.writer().await.map_err(|_| Unsent)?;
    // A dropped batch (the runtime shutting down) closes the connection, which rolls the transaction back.
    conn.set_open(true);
    let begun = conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; {LOCK_TIMEOUT}")))).await;
    if conn.check(begun).is_err() {
        return Err(Unsent);
    }
    let mut outcomes = Vec::with_capacity(batch.len());
    for m in batch {
        if savepoints {
            let saved = conn.execute("SAVEPOINT member").await;
            conn.check(saved).map_err(|_| Unsent)?;
        }
        let row = m.statement.query().fetch_one(&mut *conn).await;
        let outcome = match conn.check(row) {
            Ok(row) => Outcome::Ran(Ok(row)),
            Err(sqlx::Error::Database(_)) if !savepoints => {
                let back = conn.execute("ROLLBACK").await;
                if conn.check(back).is_ok() {
                    conn.set_open(false);
                }
                return Err(Unsent);
            }
            Err(sqlx::Error::Database(e)) => {
                let back = conn.execute("ROLLBACK TO SAVEPOINT member").await;
                conn.check(back).map_err(|_| Unsent)?;
                match e.code().as_deref().and_then(common::checked) {
                    Some(_) => Outcome::Ran(Err(sqlx::Error::Database(e))),
                    None => Outcome::Alone,
                }
            }
            // The connection failed before the `COMMIT`: the server rolls the transaction back.
            Err(_) => return Err(Unsent),
        };
        outcomes.push(outcome);
    }
    // The `COMMIT` without the batch's lock timeout: Postgres takes a lock to queue the members' notifications
    // at commit, which must not time out the whole batch.
    let committed = conn.execute(sqlx::raw_sql("SET LOCAL lock_timeout = 0; COMMIT")).await;
    match conn.check(committed) {
        Ok(_) => {
            conn.set_open(false);
            Ok(outcomes)
        }
        // Whether it committed is unknown (a refusal at `COMMIT` is no proof: a server shutting down answers
        // FATAL after the commit record may be written), and the connection is closed: every member that ran
        // has a lone commit's lost answer; one rolled back to its savepoint runs alone.
        Err(e) => Ok(outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Outcome::Ran(_) => {
                    Outcome::Ran(Err(sqlx::Error::Protocol(format!("the batch's COMMIT got no answer: {e}"))))
                }
                Outcome::Alone => Outcome::Alone,
            })
            .collect()),
    }
}
