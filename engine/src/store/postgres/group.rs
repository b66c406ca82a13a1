//! Group commit on Postgres: one-statement commits of different workflows that arrive while every commit slot
//! is busy are gathered and sent together, as one call that runs them in one transaction, each in a
//! subtransaction of its own.
//!
//! A commit takes a free slot and runs alone at once, as before (a lone payment never waits for company).
//! Commits that find every slot busy queue; the slot that frees first takes the queue (up to a batch) and sends
//! it as one call of `onceflow_batch` (migrations 0059, 0060) in autocommit: one round trip, one commit and one
//! WAL flush for the batch instead of one each. The gathering window is thus the time the slots are busy, never a
//! timer. A commit sent alone holds its slot at most `SLOT_HOLD` (50 ms) once sent: one that waits longer (for a
//! row lock, say) gives the slot back to the queue and goes on without it, so that two such commits cannot hold
//! up every other commit of the process. The function runs each member's statement as a prepared statement of the
//! session (prepared from the text the call carries, the first time), its arguments passed as text (`args.rs`)
//! and converted there to the types sqlx would have sent; each member's statement answers its columns as one
//! `text[]` (`commit.rs`).
//!
//! Each member's statement carries its own fence (lease epoch), guards and unique keys, checked by its own
//! `onceflow_check` calls. A member whose statement raises — a check, a lock it waited for too long (the function
//! sets a short `lock_timeout`, so that a member waiting on another transaction cannot hold the batch), any
//! database error — is rolled back alone: nothing of it stays, the others go on. A check's outcome is the
//! member's answer once the batch has committed (what it saw is then what is committed); any other error is
//! answered by running the member again alone after the batch, exactly as it would have run without batching.
//! Answers are given only after the commit: if the call is refused (an ERROR rolls its transaction back), every
//! member runs alone; if the connection fails once the call was sent, or the server ends the session, whether it
//! committed is unknown, and every member gets the error a lone commit would have had (the engine treats it as
//! such).
//!
//! The prepared statements are named after their text and the connection's plan generation
//! (`Writer::plans`): when the held connection's statements are planned again (`held.rs`), the function drops
//! the older generation's as it prepares the new one's.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Row, SqlStr};
use tokio::sync::oneshot;

use super::PgStore;
use super::args::Texts;
use crate::error::Result;
use crate::store::{Committed, Store, common};

/// The most members of a batch: each member that writes takes a subtransaction id, and past 64 of them in one
/// transaction Postgres's snapshots slow down for every session.
const _: () = assert!(super::MAX_BATCH < 64);

/// A commit's answer: its phase's outputs, or the outcome of the check of its that refused it (OF001–OF003). Any
/// other error is the `Err` around it.
pub(super) type Answer = std::result::Result<Vec<Option<String>>, Committed>;

/// One commit's statement: its SQL and arguments, prepared and cached per connection like any query; where its
/// answer's outputs are; and, once it queues, its form as a batch's member.
pub(super) struct Statement {
    sql: SqlStr,
    args: PgArguments,
    /// The outputs are `.1` columns from column `.0`.
    outputs: (usize, usize),
    batched: Option<Batched>,
}

/// A commit as a member of a batch: its statement answering one `text[]` (the same columns as text), and its
/// arguments as text (see `args.rs`).
pub(super) struct Batched {
    pub(super) sql: Arc<str>,
    pub(super) args: Texts,
}

impl Statement {
    /// The statement of `query`, its arguments taken out, whose answer holds `outputs.1` outputs from column
    /// `outputs.0`.
    pub(super) fn new(mut query: super::rows::PgQuery<'_>, outputs: (usize, usize)) -> Result<Self> {
        use sqlx::Execute;
        let args = query.take_arguments().map_err(sqlx::Error::Encode)?.unwrap_or_default();
        Ok(Self { sql: query.sql(), args, outputs, batched: None })
    }

    /// The query, to send once.
    fn into_query(self) -> super::rows::PgQuery<'static> {
        sqlx::query_with(self.sql, self.args)
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
    /// How long a commit sent alone holds its slot before it gives it back and goes on without one.
    hold: Duration,
    state: Mutex<State>,
    /// Batches sent, and the commits they answered (not those that left them to run alone).
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
    /// Up to `slots` commits (or batches) at once, batches of up to `max_batch` members; a commit sent alone
    /// holds its slot at most `hold`.
    pub(super) fn new(slots: usize, max_batch: usize, hold: Duration) -> Self {
        Self {
            slots: slots.max(1),
            max_batch: max_batch.max(1),
            hold,
            state: Mutex::new(State::default()),
            batches: AtomicU64::new(0),
            members: AtomicU64::new(0),
        }
    }

    /// Batches sent so far, and the commits they answered.
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

/// Runs `statement` as a commit of its own, or in a batch with others when every slot is busy; `batched` makes
/// its form as a batch's member (only for a commit that queues: one that finds a slot free never needs it).
pub(super) async fn commit(
    store: &PgStore,
    mut statement: Statement,
    batched: impl FnOnce() -> Result<Batched>,
) -> Result<Answer> {
    let Some(group) = store.group.as_ref() else { return alone(store, statement, None).await };
    let mut batched = Some(batched);
    let waiting = loop {
        {
            let mut s = group.state.lock().map_err(|_| poisoned())?;
            if s.busy < group.slots {
                s.busy += 1;
                break Err(statement);
            }
            if statement.batched.is_some() || batched.is_none() {
                let (reply, answer) = oneshot::channel();
                s.queue.push_back(Member { statement, reply });
                break Ok(answer);
            }
        }
        // It will queue: its batched form, made outside the lock, then the slots looked at again.
        if let Some(make) = batched.take() {
            statement.batched = Some(make()?);
        }
    };
    match waiting {
        // A member's answer is always sent; a dropped sender means the runtime is shutting down.
        Ok(answer) => answer.await.map_err(|_| sqlx::Error::PoolClosed)?,
        Err(statement) => {
            let slot = Slot(store.clone());
            let (sent, connected) = oneshot::channel();
            let mut run = std::pin::pin!(alone(store, statement, Some(sent)));
            if let Some(answer) = within_hold(run.as_mut(), connected, group.hold).await {
                return answer;
            }
            // Held `hold` since it was sent: the slot goes back (to the queue, if commits wait) and the commit goes
            // on without it.
            drop(slot);
            run.await
        }
    }
}

/// Polls `run` (a commit sent alone, which says on `connected` when it has its connection) until it is ready: its
/// output, or `None` once `hold` has passed since it was sent (it is then still under way). A commit that waits
/// that long for a row lock (an operator's open transaction, another process's commit) or a slow server would
/// otherwise keep the process's other commits queued behind its slot for as long as it waits, and it saves
/// nothing by being sent alone; the wait for a connection is not counted, so that a pool short of connections
/// does not turn group commit off.
async fn within_hold<T>(
    mut run: std::pin::Pin<&mut impl Future<Output = T>>,
    connected: oneshot::Receiver<()>,
    hold: Duration,
) -> Option<T> {
    // A dropped sender (the commit failed before it had a connection) ends this wait as well.
    tokio::select! {
        biased;
        out = &mut run => return Some(out),
        _ = connected => {}
    }
    tokio::select! {
        biased;
        out = &mut run => Some(out),
        () = tokio::time::sleep(hold) => None,
    }
}

fn poisoned() -> sqlx::Error {
    sqlx::Error::Protocol("the group commit's state is poisoned".into())
}

/// One statement in autocommit on a writer connection: the commit without batching. `connected` is told when
/// the connection is in hand (see [`within_hold`]).
async fn alone(store: &PgStore, statement: Statement, connected: Option<oneshot::Sender<()>>) -> Result<Answer> {
    let (first, count) = statement.outputs;
    let mut conn = store.writer().await?;
    if let Some(connected) = connected {
        let _ = connected.send(());
    }
    let row = statement.into_query().fetch_one(&mut *conn).await;
    match conn.check(row) {
        Ok(row) => Ok(Ok(common::read_outputs(&row, first, count)?)),
        Err(sqlx::Error::Database(e)) => match e.code().as_deref().and_then(common::checked) {
            Some(outcome) => Ok(Err(outcome)),
            None => Err(sqlx::Error::Database(e).into()),
        },
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
                // Alone on the drain's slot, at most `hold` once sent: past it the commit goes on in a task of
                // its own and the drain takes the next batch.
                let (sent, connected) = oneshot::channel();
                let run = {
                    let store = store.clone();
                    async move {
                        let answer = alone(&store, m.statement, Some(sent)).await;
                        let _ = m.reply.send(answer);
                    }
                };
                let mut run = Box::pin(run);
                if within_hold(run.as_mut(), connected, group.hold).await.is_none() {
                    tokio::spawn(run);
                }
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
    /// Its statement ran: its answer, final once the batch has committed (or the error of a batch whose commit's
    /// outcome is unknown).
    Ran(Result<Answer>),
    /// Its statement failed otherwise and was rolled back, or it has no batched form: it runs alone.
    Alone,
}

/// Sends `batch` as one call of `onceflow_batch` (see the module) and answers each member.
async fn batch_commit(store: &PgStore, batch: Vec<Member>) {
    let outcomes = match in_one_call(store, &batch).await {
        Ok(outcomes) => outcomes,
        // Nothing was committed: every member runs alone.
        Err(Unsent) => batch.iter().map(|_| Outcome::Alone).collect(),
    };
    if let Some(group) = &store.group {
        let answered = outcomes.iter().filter(|o| matches!(o, Outcome::Ran(_))).count();
        group.batches.fetch_add(1, Ordering::Relaxed);
        group.members.fetch_add(answered as u64, Ordering::Relaxed);
    }
    // The members whose outcome is known are answered first; each of the others runs alone in a task of its own,
    // so that one waiting for a row lock (why most leave a batch) holds neither the slot nor the rest.
    for (m, outcome) in batch.into_iter().zip(outcomes) {
        match outcome {
            Outcome::Ran(answer) => {
                let _ = m.reply.send(answer);
            }
            Outcome::Alone => {
                let store = store.clone();
                tokio::spawn(async move {
                    let answer = alone(&store, m.statement, None).await;
                    let _ = m.reply.send(answer);
                });
            }
        }
    }
}

/// The batch did not commit, surely: nothing of it is in the database.
struct Unsent;

/// The arguments of one `onceflow_batch` call: each distinct statement once (its name and `PREPARE` text),
/// each member's statement (1-based) and arguments.
#[derive(Default)]
struct Call {
    names: Vec<String>,
    decls: Vec<String>,
    shape: Vec<i32>,
    counts: Vec<i32>,
    args: Vec<Option<String>>,
}

impl Call {
    /// The call for the members of `batch` that have a batched form (the others are `None` in the returned
    /// list, in `batch`'s order; the rest are `Some` of their place in the call), under plan generation
    /// `generation`.
    fn of(batch: &[Member], generation: u64) -> (Self, Vec<Option<usize>>) {
        let mut call = Self::default();
        let mut places = Vec::with_capacity(batch.len());
        for m in batch {
            let Some(b) = &m.statement.batched else {
                places.push(None);
                continue;
            };
            let decl = format!("({}) AS {}", b.args.types.join(", "), b.sql);
            let mut hasher = std::hash::DefaultHasher::new();
            decl.hash(&mut hasher);
            let name = format!("onceflow_b{generation}_{:016x}", hasher.finish());
            let shape = match call.names.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    call.names.push(name);
                    call.decls.push(decl);
                    call.names.len() - 1
                }
            };
            places.push(Some(call.shape.len()));
            call.shape.push(i32::try_from(shape + 1).unwrap_or(i32::MAX));
            call.counts.push(i32::try_from(b.args.values.len()).unwrap_or(i32::MAX));
            call.args.extend(b.args.values.iter().cloned());
        }
        (call, places)
    }
}

/// The batch as one call of `onceflow_batch` in autocommit: one round trip and one commit. Each member's
/// outcome once committed; `Err(Unsent)` when it surely did not commit; every member that ran answered an error
/// when the commit's outcome is unknown.
async fn in_one_call(store: &PgStore, batch: &[Member]) -> std::result::Result<Vec<Outcome>, Unsent> {
    let mut conn = store.writer().await.map_err(|_| Unsent)?;
    let generation = conn.plans();
    let (call, places) = Call::of(batch, generation);
    if call.shape.is_empty() {
        return Err(Unsent);
    }
    let rows = sqlx::query("SELECT member, code, result FROM onceflow_batch($1, $2, $3, $4, $5, $6)")
        .bind(generation.to_string())
        .bind(&call.names)
        .bind(&call.decls)
        .bind(&call.shape)
        .bind(&call.counts)
        .bind(&call.args)
        .fetch_all(&mut *conn)
        .await;
    // An error rolled the call back (the statement's transaction), unless the server ended the session (FATAL,
    // PANIC), which may have written the commit record first.
    let rows = match conn.check(rows) {
        Ok(rows) => rows,
        Err(sqlx::Error::Database(e)) if !super::ends_session(&*e) => return Err(Unsent),
        Err(e) => return Ok(lost(&places, &e)),
    };
    // Each row names its member's place in the call (never missing or out of order: the function answers each
    // member in turn; a member without its row has a lost answer, its commit may stand).
    let mut answered: Vec<Option<&PgRow>> = vec![None; call.shape.len()];
    for row in &rows {
        let place = row.try_get::<i32, _>(0).ok().and_then(|k| usize::try_from(k).ok()).and_then(|k| k.checked_sub(1));
        if let Some(slot) = place.and_then(|i| answered.get_mut(i)) {
            *slot = Some(row);
        }
    }
    Ok(batch
        .iter()
        .zip(&places)
        .map(|(m, place)| match place {
            Some(i) => match answered.get(*i).copied().flatten() {
                Some(row) => answer_of(row, m.statement.outputs),
                None => lost_answer("the batch did not answer it"),
            },
            None => Outcome::Alone,
        })
        .collect())
}

/// The outcomes when the batch's commit is not known to have happened or not (the connection failed once the
/// call was sent, or the server ended the session): each member that was in it has a lone commit's lost answer.
fn lost(places: &[Option<usize>], e: &sqlx::Error) -> Vec<Outcome> {
    places.iter().map(|place| if place.is_some() { lost_answer(&e.to_string()) } else { Outcome::Alone }).collect()
}

fn lost_answer(why: &str) -> Outcome {
    Outcome::Ran(Err(sqlx::Error::Protocol(format!("the batch's commit got no answer: {why}")).into()))
}

/// A member's columns as its statement answers them in a batch.
type Columns = Vec<Option<String>>;

/// A member's outcome from its row of `onceflow_batch`: its outputs (`outputs.1` of them from place
/// `outputs.0`), a check's refusal, or, for any other error, running alone (its statement was rolled back). A
/// row that cannot be read is a lost answer, never a reason to run it again: its commit may have stood.
fn answer_of(row: &PgRow, (first, count): (usize, usize)) -> Outcome {
    let read = row.try_get::<Option<String>, _>(1).and_then(|code| Ok((code, row.try_get::<Option<Columns>, _>(2)?)));
    match read {
        Ok((Some(code), _)) => match common::checked(&code) {
            Some(outcome) => Outcome::Ran(Ok(Err(outcome))),
            None => Outcome::Alone,
        },
        Ok((None, Some(columns))) if columns.len() >= first + count => {
            Outcome::Ran(Ok(Ok(columns.into_iter().skip(first).take(count).collect())))
        }
        Ok((None, _)) => lost_answer("its statement answered no columns"),
        Err(e) => lost_answer(&e.to_string()),
    }
}
