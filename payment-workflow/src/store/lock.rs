//! The retention pass's lock: one process at a time runs a pass on a database. Each backend takes it in its
//! own file (Postgres `pg_try_advisory_lock`, MySQL `GET_LOCK`, SQLite none: one process) on a connection of
//! its own, held for the whole pass, and says how to give it back.

use sqlx::pool::PoolConnection;
use sqlx::{MySql, Postgres};

/// The lock of one retention pass, held until [`PassLock::release`]. Dropped unreleased (a pass that
/// panicked or was cancelled), its connection is closed rather than returned to the pool, and the database
/// drops a closed session's lock.
pub struct PassLock {
    held: Option<Held>,
}

/// The session holding the lock, and the statement that releases it.
enum Held {
    Postgres(PoolConnection<Postgres>, &'static str),
    MySql(PoolConnection<MySql>, &'static str),
}

impl PassLock {
    /// No lock to hold: a database only one process opens (SQLite).
    pub(crate) fn alone() -> Self {
        Self { held: None }
    }

    /// A Postgres session holding the lock, released by `unlock`.
    pub(crate) fn postgres(conn: PoolConnection<Postgres>, unlock: &'static str) -> Self {
        Self { held: Some(Held::Postgres(conn, unlock)) }
    }

    /// A MySQL session holding the lock, released by `unlock`.
    pub(crate) fn mysql(conn: PoolConnection<MySql>, unlock: &'static str) -> Self {
        Self { held: Some(Held::MySql(conn, unlock)) }
    }

    /// Releases the lock; its connection is then closed (it was marked so when taken, so that no way of ending
    /// a pass — a failed release, a cancelled future, a panic — returns it to the pool still locked).
    pub async fn release(mut self) -> Result<(), sqlx::Error> {
        let released = match &mut self.held {
            Some(Held::Postgres(conn, unlock)) => {
                sqlx::query_scalar::<_, Option<bool>>(*unlock).fetch_one(&mut **conn).await.map(|r| r == Some(true))
            }
            Some(Held::MySql(conn, unlock)) => {
                sqlx::query_scalar::<_, Option<i64>>(*unlock).fetch_one(&mut **conn).await.map(|r| r == Some(1))
            }
            None => Ok(true),
        };
        match released {
            Ok(true) => self.held = None,
            // The session no longer held it (a pooler that moved the session, say): say so, since every later
            // pass of every process would find the lock taken while that session lives.
            Ok(false) => tracing::warn!("the retention lock was not held by its session when released"),
            Err(_) => {}
        }
        released.map(drop)
    }
}

impl Drop for PassLock {
    fn drop(&mut self) {
        // Detached, the connection is closed when dropped instead of going back to the pool still locked.
        match self.held.take() {
            Some(Held::Postgres(conn, _)) => drop(conn.detach()),
            Some(Held::MySql(conn, _)) => drop(conn.detach()),
            None => {}
        }
    }
}
