//! Pings that keep a store from sending a call on a connection the server ended while it sat idle (a restart,
//! `pg_terminate_backend`, Postgres's `idle_session_timeout`, MySQL's `wait_timeout`, an operator's `KILL`): the
//! call would fail, and a commit's would lose its answer (the server's goodbye may follow a commit record). Held
//! connections are pinged by [`Held`](super::held::Held) when taken after `PING_IDLE`; the pools' own
//! connections by [`ping_if_idle`], their check before they lend one.

use std::time::Duration;

use sqlx::pool::{PoolConnection, PoolConnectionMetadata};
use sqlx::{Connection, Database};

/// How long a connection may sit idle, held or in a pool, before it is pinged when next taken (on Postgres and
/// MySQL). A held connection under load never sits idle this long (they are lent last-in first-out); a pool lends
/// its oldest idle connection first, so a pool lending fewer connections a second than it keeps pings each one.
pub const PING_IDLE: Duration = Duration::from_secs(1);

/// How long a held connection's ping may take before the connection counts as gone (a half-open connection would
/// otherwise hold the caller until the kernel gives up on it).
const PING_WAIT: Duration = Duration::from_secs(2);

/// How long a pool may take to lend a connection (`PoolOptions::acquire_timeout`) before the caller gets
/// `PoolTimedOut`: with the database gone, sqlx keeps reconnecting until then, so a short one answers `503` fast
/// instead of holding requests (and doubles as load shedding when the pool is exhausted).
pub(crate) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the pools' check may wait for a ping: well within [`ACQUIRE_TIMEOUT`], which counts the check too
/// (and the wait for a free slot before it), so that a connection that does not answer leaves at least half of it
/// to open another when the slot came at once. A server stalled longer than this has the connection closed and a
/// new one opened (at low load only: under load no connection is idle long enough to be pinged), which may end in
/// `PoolTimedOut` where the call would have waited.
const POOL_PING_WAIT: Duration = Duration::from_millis(500);
const _: () = assert!(POOL_PING_WAIT.as_millis() * 2 < ACQUIRE_TIMEOUT.as_millis());

/// A pool's check before it lends an idle connection (`PoolOptions::before_acquire`): one idle `PING_IDLE` or
/// more is pinged, and one that does not answer within [`POOL_PING_WAIT`] is refused, so the pool closes it and
/// opens a new one (sqlx 0.9 does not try its other idle connections then). A read or a transaction sent on a
/// connection the server ended would fail, and a commit that finds every held connection busy takes the pool's,
/// its answer lost. One idle under `PING_IDLE` is lent unpinged.
pub(crate) fn ping_if_idle<C: Connection>(
    conn: &mut C,
    meta: PoolConnectionMetadata,
) -> std::pin::Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + '_>> {
    Box::pin(async move {
        if meta.idle_for < PING_IDLE {
            return Ok(true);
        }
        match tokio::time::timeout(POOL_PING_WAIT, conn.ping()).await {
            Ok(answer) => answer.map(|()| true),
            Err(_) => Err(no_answer()),
        }
    })
}

/// The error of a ping that got no answer in time.
fn no_answer() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer to a ping"))
}

/// `conn` if it answers a ping within [`PING_WAIT`]; else the error, and the connection is closed when dropped.
pub(crate) async fn answering<DB: Database>(mut conn: PoolConnection<DB>) -> Result<PoolConnection<DB>, sqlx::Error> {
    let failed = match tokio::time::timeout(PING_WAIT, conn.ping()).await {
        Ok(Ok(())) => return Ok(conn),
        Ok(Err(e)) => e,
        Err(_) => no_answer(),
    };
    conn.close_on_drop();
    Err(failed)
}
