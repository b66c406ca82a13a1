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

    /// Releases the lock, and returns its connection to the pool (or, if the release failed, closes it).
    pub async fn release(mut self) -> Result<(), sqlx::Error> {
        let released = match &mut self.held {
            Some(Held::Postgres(conn, unlock)) => sqlx::query(*unlock).execute(&mut **conn).await.map(drop),
            Some(Held::MySql(conn, unlock)) => sqlx::query(*unlock).execute(&mut **conn).await.map(drop),
            None => Ok(()),
        };
        if released.is_ok() {
            self.held = None;
        }
        released
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
