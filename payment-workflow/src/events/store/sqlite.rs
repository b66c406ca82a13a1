//! Events on SQLite: one writer at a time, so an event's row number (`seq`, `AUTOINCREMENT`: never given twice)
//! is the order of commits, and every row a reader sees is final.

use onceflow_engine::SqliteStore;

use super::standard::StandardEvents;

/// The columns of an event as `Event` reads them.
const EVENT: &str = "id, tenant, type, data, created_at, traceparent, seq AS position";

impl StandardEvents for SqliteStore {
    const POSITION: &'static str = "seq";
    const ORDER: &'static str = "seq";
    // `BEGIN IMMEDIATE` (every write transaction of the store) makes it the only writer: nothing to lock.
    const SKIP_LOCKED: &'static str = "";
    const FOR_SHARE: &'static str = "";
    const FOR_UPDATE: &'static str = "";
    /// The machine's clock (every process on one SQLite file shares it), in ms, whatever the process's own
    /// clock says.
    const NOW: &'static str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
    /// `BEGIN IMMEDIATE` (every write transaction of the store) already makes it the only writer.
    const DISPATCH_LOCK: Option<&'static str> = None;
    const DISPATCH_CURSOR: &'static str = "SELECT position, event_id FROM event_dispatch WHERE id = 1";
    const MOVE_DISPATCH: &'static str =
        "UPDATE event_dispatch SET position = CAST($1 AS INTEGER), event_id = $2 WHERE id = 1";
    const UNDISPATCHED: &'static str = "SELECT e.created_at FROM events e, event_dispatch c WHERE c.id = 1 \
        AND e.seq > c.position ORDER BY e.seq LIMIT 1";

    fn after(major: usize, id: usize) -> String {
        // Each `seq` is one event: the id is only there to take the same parameters as on Postgres.
        format!("(seq > CAST(${major} AS INTEGER) OR (seq = CAST(${major} AS INTEGER) AND id > ${id}))")
    }

    fn log(scoped: bool, types: usize) -> String {
        let after = Self::after(1, 2);
        let tenant = if scoped { " AND tenant = $4" } else { "" };
        let first = if scoped { 5 } else { 4 };
        let kinds =
            if types == 0 { String::new() } else { format!(" AND type IN ({})", super::numbered(first, types)) };
        // One statement: one read of the database for both parts.
        format!(
            "SELECT * FROM (SELECT {EVENT}, 0 AS tail FROM events WHERE {after}{tenant}{kinds} ORDER BY seq LIMIT $3) \
             UNION ALL SELECT * FROM (SELECT {EVENT}, 1 AS tail FROM events WHERE {after}{tenant} \
             ORDER BY seq DESC LIMIT 1) ORDER BY tail, position"
        )
    }

    fn rows(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}
