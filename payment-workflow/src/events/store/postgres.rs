//! Events on Postgres: the log in commit order by transaction id. An event's row carries the id of the
//! transaction that wrote it (`txid`, a column default); the log is read in `(txid, id)` order and only below
//! [`VISIBLE`]: every transaction of this database below it has ended, and every later transaction gets a
//! larger id, so no event can still appear before a position once the log has shown it — a cursor taken now
//! misses nothing that commits later, whatever the order of commits.

use onceflow_engine::PgStore;

use super::standard::StandardEvents;

/// The log's bound, read in the statement's snapshot: its oldest transaction still running (`xip`), leaving
/// out those `pg_stat_activity` shows to belong to another database (they cannot write this database's events),
/// else the snapshot's `xmax`. Without that, a long write transaction anywhere on the server (a migration, a
/// `DROP DATABASE` elsewhere) would hold the log back. A transaction not shown — ended since the snapshot, a
/// prepared one, another role's session without `pg_read_all_stats` — is counted as this database's: the bound
/// is then lower, never wrong. `backend_xid` is 32 bits: compared with the low 32 bits of the snapshot's xid8.
const VISIBLE: &str = "(SELECT LEAST(pg_snapshot_xmax(s), (SELECT min(x) FROM pg_snapshot_xip(s) AS x \
    WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.backend_xid IS NOT NULL \
    AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database()) \
    AND a.backend_xid::text::bigint = x::text::bigint % 4294967296))) FROM pg_current_snapshot() AS s)";

impl StandardEvents for PgStore {
    const POSITION: &'static str = "txid::text::bigint";
    const ORDER: &'static str = "txid, id";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    /// One dispatcher at a time per database, for its transaction: `onceflow.events` in ASCII.
    const DISPATCH_LOCK: Option<&'static str> = Some("SELECT pg_try_advisory_xact_lock(7957407298470417779)");
    const DISPATCH_CURSOR: &'static str = "SELECT txid::text::bigint, event_id FROM event_dispatch WHERE id = 1";
    const MOVE_DISPATCH: &'static str = "UPDATE event_dispatch SET txid = $1::text::xid8, event_id = $2 WHERE id = 1";

    fn after(major: usize, id: usize) -> String {
        format!("(txid, id) > (${major}::text::xid8, ${id}) AND txid < {VISIBLE}")
    }

    fn rows(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }
}
