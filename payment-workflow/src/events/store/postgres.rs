//! Events on Postgres: the log in commit order by transaction id. An event's row carries the id of the
//! transaction that wrote it (`txid`, a column default); the log is read in `(txid, id)` order and only below
//! the oldest transaction still running (`pg_snapshot_xmin` of the statement's snapshot). Every transaction below
//! that has ended, and every later one gets a larger id, so no event can still appear before a position once the
//! log has shown it: a cursor taken now misses nothing that commits later, whatever the order of commits.

use onceflow_engine::PgStore;

use super::standard::StandardEvents;

impl StandardEvents for PgStore {
    const POSITION: &'static str = "txid::text::bigint";
    const ORDER: &'static str = "txid, id";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    /// One dispatcher at a time per database, for its transaction: `onceflow.events` in ASCII.
    const DISPATCH_LOCK: Option<&'static str> = Some("SELECT pg_try_advisory_xact_lock(7957407298470417779)");
    const DISPATCH_CURSOR: &'static str = "SELECT txid::text::bigint, event_id FROM event_dispatch WHERE id = 1";
    const MOVE_DISPATCH: &'static str = "UPDATE event_dispatch SET txid = $1::text::xid8, event_id = $2 WHERE id = 1";

    fn after(major: usize, id: usize) -> String {
        format!("(txid, id) > (${major}::text::xid8, ${id}) AND txid < pg_snapshot_xmin(pg_current_snapshot())")
    }

    fn rows(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }
}
