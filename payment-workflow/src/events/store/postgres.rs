//! Events on Postgres: the log in commit order by transaction id. An event's row carries the id of the
//! transaction that wrote it (`txid`, a column default); the log is read in `(txid, id)` order and only below
//! [`VISIBLE`]: every transaction of this database below it has ended, and every later transaction gets a
//! larger id, so no event can still appear before a position once the log has shown it — a cursor taken now
//! misses nothing that commits later, whatever the order of commits.

use onceflow_engine::{PgStore, Store};

use super::Holder;
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

/// The columns of an event as `Event` reads them.
const EVENT: &str = "id, tenant, type, data, created_at, traceparent, txid::text::bigint AS position";

impl StandardEvents for PgStore {
    const POSITION: &'static str = "txid::text::bigint";
    const ORDER: &'static str = "txid, id";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const FOR_SHARE: &'static str = " FOR SHARE";
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    /// The wall clock when the statement began (not the transaction's: a lease starts when it is taken), the
    /// same through the statement, so an index can compare with it.
    const NOW: &'static str = "(extract(epoch FROM statement_timestamp()) * 1000)::bigint";
    /// One dispatcher at a time per database, for its transaction: `onceflow.events` in ASCII.
    const DISPATCH_LOCK: Option<&'static str> = Some("SELECT pg_try_advisory_xact_lock(7957407298470417779)");
    const DISPATCH_CURSOR: &'static str = "SELECT txid::text::bigint, event_id FROM event_dispatch WHERE id = 1";
    const MOVE_DISPATCH: &'static str = "UPDATE event_dispatch SET txid = $1::text::xid8, event_id = $2 WHERE id = 1";
    /// Without the bound: an event committed but not shown yet (an older transaction still running) counts.
    const UNDISPATCHED: &'static str = "SELECT e.created_at FROM events e, event_dispatch c WHERE c.id = 1 \
        AND (e.txid, e.id) > (c.txid, c.event_id) ORDER BY e.txid, e.id LIMIT 1";

    fn after(major: usize, id: usize) -> String {
        format!("(txid, id) > (${major}::text::xid8, ${id}) AND txid < {VISIBLE}")
    }

    fn log(scoped: bool, types: usize) -> String {
        // The bound once, for both parts: they see the same log.
        let tenant = if scoped { " AND tenant = $4" } else { "" };
        let first = if scoped { 5 } else { 4 };
        let kinds =
            if types == 0 { String::new() } else { format!(" AND type IN ({})", super::numbered(first, types)) };
        format!(
            "WITH bound AS MATERIALIZED (SELECT {VISIBLE} AS v) \
             (SELECT {EVENT}, 0::bigint AS tail FROM events, bound WHERE (txid, id) > ($1::text::xid8, $2) \
             AND txid < bound.v{tenant}{kinds} ORDER BY txid, id LIMIT $3) \
             UNION ALL (SELECT {EVENT}, 1::bigint AS tail FROM events, bound \
             WHERE (txid, id) > ($1::text::xid8, $2) AND txid < bound.v{tenant} ORDER BY txid DESC, id DESC LIMIT 1) \
             ORDER BY tail, position, id"
        )
    }

    async fn held_by(&self) -> Result<Option<Holder>, sqlx::Error> {
        // The oldest transaction of this database with an id: the log's bound is at most its id.
        let row: Option<(i32, Option<i64>, Option<String>)> = sqlx::query_as(
            "SELECT a.pid, (extract(epoch FROM a.xact_start) * 1000)::bigint, a.state FROM pg_stat_activity a \
             WHERE a.datid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid() ORDER BY age(a.backend_xid) DESC LIMIT 1",
        )
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|(pid, xact_start, state)| Holder { pid, xact_start, state }))
    }

    fn rows(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }
}
