//! Connections a store keeps checked out of its pool for one-call writes.
//!
//! An sqlx pool pings every connection returned to it before another caller may have it: a round trip to the
//! Postgres server, or a hand-off to SQLite's worker thread. A commit that is one call would pay two, and on
//! SQLite's single writer the next commit waits for the ping. Held connections go back to a list of their own
//! instead; only one whose call may have left a transaction open, or its answer still on the way (its future
//! dropped mid-call), is closed. On Postgres the next caller would otherwise read that answer as its own (sqlx
//! reads what is pending before it sends, and returns an error found there as the new call's); on SQLite each
//! call has a reply channel of its own, and closing costs only a reopened connection.
//!
//! A held connection lives as long as the process, and Postgres keeps a connection's plan of each prepared
//! statement until something invalidates it (DDL, or an `ANALYZE` of a table it reads — autovacuum's, where it
//! runs). A generic plan made while a table was nearly empty (a fresh database, or statistics taken while it
//! was) scans that table whole, and would go on scanning it as it grows to millions of rows. So a store may ask
//! for its held connections' statements to be dropped and planned again as they age ([`Held::replan_after`]):
//! after a first wait, then after each wait doubled, up to [`REPLAN_MAX`].
//!
//! A held connection may also have been ended by the server while it sat idle (a restart, `pg_terminate_backend`,
//! `idle_session_timeout`): the call sent on it next reads the server's goodbye as its answer, and for a commit
//! that is an answer lost (the error may have come after a commit), for each member of a group-commit batch. So a
//! store may ask for a connection idle longer than a given time to be pinged before it is lent
//! ([`Held::ping_after`]): one that does not answer is closed, the idle ones beside it go back to the pool
//! (which keeps those that answer its ping), and another is taken from the pool, pinged alike. A connection whose
//! call read such a goodbye is not lent again either. One idle under that time is lent unpinged: a server that
//! ends sessions under load still costs the calls then on their way, as before.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::database::HasStatementCache;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Database};
use tokio::sync::{Semaphore, SemaphorePermit};

use super::ping::answering;
use crate::error::Result;

/// The longest wait between two plannings of a held connection's statements.
pub(crate) const REPLAN_MAX: Duration = Duration::from_secs(600);

/// When a held connection's statements are next dropped to be planned again, and the wait after that.
#[derive(Debug, Clone, Copy)]
struct Replan {
    at: Instant,
    wait: Duration,
    /// How many times the connection's statements were dropped before.
    done: u64,
}

impl Replan {
    /// The first planning again, `wait` from now.
    fn after(wait: Duration) -> Self {
        Self { at: Instant::now() + wait, wait, done: 0 }
    }

    /// The one after this, twice the wait later (at most [`REPLAN_MAX`]).
    fn next(self) -> Self {
        Self { done: self.done + 1, ..Self::after(self.wait.saturating_mul(2).min(REPLAN_MAX)) }
    }
}

/// An idle held connection, with its next planning again and when it was given back.
type Idle<DB> = (PoolConnection<DB>, Option<Replan>, Instant);

/// Up to `max` connections taken from `pool` and kept for one-call writes.
#[derive(Debug)]
pub(crate) struct Held<DB: Database> {
    pool: sqlx::Pool<DB>,
    idle: Mutex<Vec<Idle<DB>>>,
    permits: Semaphore,
    /// The first wait before a connection's statements are planned again; none: never.
    replan: Option<Duration>,
    /// How long a connection may sit idle before it is pinged when taken; none: never pinged.
    ping_after: Option<Duration>,
    /// Whether a database error ended its session (the server's goodbye): the connection is not lent again.
    ends_session: fn(&(dyn sqlx::error::DatabaseError + 'static)) -> bool,
}

impl<DB: Database + HasStatementCache> Held<DB> {
    /// Holds up to `max` (at least one) of `pool`'s connections, taken as callers need them.
    pub(crate) fn new(pool: sqlx::Pool<DB>, max: usize) -> Self {
        let permits = Semaphore::new(max.max(1));
        Self { pool, idle: Mutex::new(Vec::new()), permits, replan: None, ping_after: None, ends_session: |_| false }
    }

    /// Pings a connection that sat idle longer than `idle` before lending it, and one newly taken from the pool
    /// (see the module): a commit sent on a connection the server ended meanwhile would lose its answer.
    /// `ends_session` tells the database errors that end a session: a connection that answered one is broken.
    pub(crate) fn ping_after(
        &mut self,
        idle: Duration,
        ends_session: fn(&(dyn sqlx::error::DatabaseError + 'static)) -> bool,
    ) {
        self.ping_after = Some(idle);
        self.ends_session = ends_session;
    }

    /// Drops each held connection's prepared statements `first` after it was taken (at least a millisecond, at
    /// most [`REPLAN_MAX`]), then after each wait doubled (see the module), so that they are planned again on
    /// the tables as they are by then.
    pub(crate) fn replan_after(&mut self, first: Duration) {
        self.replan = Some(first.clamp(Duration::from_millis(1), REPLAN_MAX));
    }

    /// A turn at the held connections without taking one: while it lasts, none of them is in use (with one
    /// held, nothing runs on it).
    pub(crate) async fn turn(&self) -> Result<SemaphorePermit<'_>> {
        Ok(self.permits.acquire().await.map_err(|_| sqlx::Error::PoolClosed)?)
    }

    /// A held connection, waiting for one when all are in use.
    pub(crate) async fn get(&self) -> Result<Writer<'_, DB>> {
        let permit = self.turn().await?;
        self.take(permit).await
    }

    /// A held connection, or a connection from the pool when all held ones are in use: a write then waits only
    /// when the whole pool is busy, never for a held connection while pool connections sit idle.
    pub(crate) async fn get_or_pooled(&self) -> Result<Writer<'_, DB>> {
        match self.permits.try_acquire() {
            Ok(permit) => self.take(permit).await,
            Err(_) => Ok(Writer::pooled(self.pool.acquire().await?)),
        }
    }

    async fn take<'a>(&'a self, permit: SemaphorePermit<'a>) -> Result<Writer<'a, DB>> {
        let idle = self.idle.lock().map(|mut idle| idle.pop()).unwrap_or(None);
        let (mut conn, mut replan) = match idle {
            Some((conn, replan, since)) if self.ping_after.is_some_and(|after| since.elapsed() >= after) => {
                match answering(conn).await {
                    Ok(conn) => (conn, replan),
                    // What ended it (a restart) may have ended the idle ones beside it.
                    Err(_) => {
                        self.clear_idle();
                        (self.fresh().await?, self.replan.map(Replan::after))
                    }
                }
            }
            Some((conn, replan, _)) => (conn, replan),
            None => (self.fresh().await?, self.replan.map(Replan::after)),
        };
        if let Some(due) = replan.filter(|r| r.at <= Instant::now()) {
            match conn.clear_cached_statements().await {
                Ok(()) => replan = Some(due.next()),
                // It failed on the way: back to the pool (whose ping closes it if broken), then a new one.
                Err(_) => {
                    drop(conn);
                    (conn, replan) = (self.fresh().await?, self.replan.map(Replan::after));
                }
            }
        }
        Ok(Writer { held: Some((self, permit)), conn: Some(conn), replan, in_call: false, broken: false })
    }

    /// A connection of the pool's to hold. Where held connections are pinged ([`Held::ping_after`]), one that
    /// answers a ping: the pool lends one idle under `PING_IDLE` untested, and what ended a held one may have
    /// ended it too — tried as many times as the pool has connections, and once more. (A pool connection idle a
    /// second or more is pinged by the pool's check too: one round trip more, only while held ones are taken.)
    async fn fresh(&self) -> Result<PoolConnection<DB>> {
        if self.ping_after.is_none() {
            return Ok(self.pool.acquire().await?);
        }
        let mut tries = self.pool.size() + 1;
        loop {
            let conn = self.pool.acquire().await?;
            tries = tries.saturating_sub(1);
            match answering(conn).await {
                Ok(conn) => return Ok(conn),
                Err(e) if tries == 0 => return Err(e.into()),
                Err(_) => {}
            }
        }
    }

    /// Forgets the idle held connections (back to the pool, whose ping on return closes a broken one).
    fn clear_idle(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }
}

/// A connection for one write outside a step's transaction: held by the store (see `held.rs`) or from its
/// pool. Dereferences to the connection; every call made on it passes its result through [`Writer::check`]
/// before the next call, else the connection is closed when the writer is dropped (its call counts as
/// unfinished). A call made after one that was cut short is not protected: check each call.
pub struct Writer<'a, DB: Database> {
    held: Option<(&'a Held<DB>, SemaphorePermit<'a>)>,
    conn: Option<PoolConnection<DB>>,
    /// A held connection's next planning again.
    replan: Option<Replan>,
    /// The connection was lent for a call (borrowed mutably) whose result has not passed through `check`: if
    /// its future was dropped, its answer may still be on the way, or its transaction open.
    in_call: bool,
    /// A call failed outside the database (I/O, protocol) or read the end of its session: the connection may be
    /// broken.
    broken: bool,
}

impl<'a, DB: Database> Writer<'a, DB> {
    /// A pool connection, returned to the pool when dropped.
    pub(crate) fn pooled(conn: PoolConnection<DB>) -> Self {
        Self { held: None, conn: Some(conn), replan: None, in_call: false, broken: false }
    }

    /// The connection's plan generation: how many times its prepared statements were dropped to be planned again
    /// (always 0 for a connection of the pool's). Statements a caller prepares itself are named after it, so
    /// that they are planned again with the rest (the group commit's batches: `postgres/group.rs`).
    pub(crate) fn plans(&self) -> u64 {
        self.replan.map_or(0, |r| r.done)
    }

    /// Passes on a call's `result`, marking the call finished, and noting a failure outside the database or one
    /// that ended the session (see [`Held::ping_after`]): the connection then goes back to the pool (whose ping
    /// closes it if broken) with every idle held one, since what broke one (a server restart) broke them all.
    pub fn check<T>(&mut self, result: std::result::Result<T, sqlx::Error>) -> std::result::Result<T, sqlx::Error> {
        self.in_call = false;
        let ends_session = |e: &(dyn sqlx::error::DatabaseError + 'static)| {
            self.held.as_ref().is_some_and(|(held, _)| (held.ends_session)(e))
        };
        match &result {
            Err(sqlx::Error::Database(e)) if !ends_session(&**e) => {}
            Err(_) => self.broken = true,
            Ok(_) => {}
        }
        result
    }
}

impl<DB: Database> std::ops::Deref for Writer<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match self.conn.as_ref() {
            Some(conn) => conn,
            None => unreachable!("taken only by drop"),
        }
    }
}

impl<DB: Database> std::ops::DerefMut for Writer<'_, DB> {
    /// Lends the connection for a call, which counts as unfinished until its result passes through `check`.
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.in_call = true;
        match self.conn.as_mut() {
            Some(conn) => conn,
            None => unreachable!("taken only by drop"),
        }
    }
}

impl<DB: Database> Drop for Writer<'_, DB> {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else { return };
        // A connection dropped mid-call is closed; one that failed outside the database takes the idle held
        // ones with it, whether or not its call was under way.
        let unfinished = self.in_call;
        if unfinished {
            conn.close_on_drop();
        }
        let Some((held, _)) = &self.held else { return };
        let Ok(mut idle) = held.idle.lock() else { return };
        if self.broken {
            idle.clear();
        } else if !unfinished {
            idle.push((conn, self.replan, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Sqlite;
    use sqlx::sqlite::SqlitePoolOptions;

    use super::*;

    fn idle(held: &Held<Sqlite>) -> usize {
        held.idle.lock().unwrap().len()
    }

    fn io_error() -> std::result::Result<(), sqlx::Error> {
        Err(sqlx::Error::Io(std::io::Error::other("connection reset")))
    }

    /// A connection that failed outside the database takes every idle held one with it: what broke it (a
    /// server restart) broke them too, and each would cost its next caller a failed call.
    #[tokio::test]
    async fn a_broken_connection_clears_the_idle_ones() {
        for open in [false, true] {
            let pool = SqlitePoolOptions::new().max_connections(3).connect("sqlite::memory:").await.unwrap();
            let held = Held::new(pool, 3);
            let (first, mut second) = (held.get().await.unwrap(), held.get().await.unwrap());
            drop(first);
            assert_eq!(idle(&held), 1);
            // A call under way (`open`: its connection lent) when the failure came: the idle ones go too.
            if open {
                let _lent: &mut sqlx::SqliteConnection = &mut second;
            }
            assert!(second.check(io_error()).is_err());
            drop(second);
            assert_eq!(idle(&held), 0, "open: {open}");
        }
        // A call under way when its future was dropped, with no failure: that connection is closed (it may hold
        // a transaction open), the idle ones stay.
        let pool = SqlitePoolOptions::new().max_connections(3).connect("sqlite::memory:").await.unwrap();
        let held = Held::new(pool.clone(), 3);
        let (first, mut second) = (held.get().await.unwrap(), held.get().await.unwrap());
        drop(first);
        let _lent: &mut sqlx::SqliteConnection = &mut second;
        drop(second);
        assert_eq!(idle(&held), 1);
        // Closed in the background.
        for _ in 0..100 {
            if pool.size() == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(pool.size(), 1, "the open one closed");
    }

    /// A connection lent for a call comes back to the idle list once the call's result passed through `check`;
    /// one whose call never reported back (its future dropped) is closed, not handed to the next caller.
    #[tokio::test]
    async fn a_call_that_did_not_report_back_closes_its_connection() {
        let pool = SqlitePoolOptions::new().max_connections(2).connect("sqlite::memory:").await.unwrap();
        let held = Held::new(pool.clone(), 2);
        let mut w = held.get().await.unwrap();
        let done = sqlx::query("SELECT 1").execute(&mut *w).await;
        assert!(w.check(done).is_ok());
        drop(w);
        assert_eq!(idle(&held), 1, "a finished call's connection is kept");
        let mut w = held.get().await.unwrap();
        let _lent: &mut sqlx::SqliteConnection = &mut w;
        drop(w);
        assert_eq!(idle(&held), 0, "an unfinished call's connection is not kept");
        for _ in 0..100 {
            if pool.size() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(pool.size(), 0, "and it is closed");
    }
}
