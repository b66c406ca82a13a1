//! Events on SQLite: one writer at a time, so an event's row number (`seq`, `AUTOINCREMENT`: never given twice)
//! is the order of commits, and every row a reader sees is final.

use onceflow_engine::SqliteStore;

use super::standard::StandardEvents;

impl StandardEvents for SqliteStore {
    const POSITION: &'static str = "seq";
    const ORDER: &'static str = "seq";
    const SKIP_LOCKED: &'static str = "";
    /// `BEGIN IMMEDIATE` (every write transaction of the store) already makes it the only writer.
    const DISPATCH_LOCK: Option<&'static str> = None;
    const DISPATCH_CURSOR: &'static str = "SELECT position, event_id FROM event_dispatch WHERE id = 1";
    const MOVE_DISPATCH: &'static str =
        "UPDATE event_dispatch SET position = CAST($1 AS INTEGER), event_id = $2 WHERE id = 1";

    fn after(major: usize, id: usize) -> String {
        // Each `seq` is one event: the id is only there to take the same parameters as on Postgres.
        format!("(seq > CAST(${major} AS INTEGER) OR (seq = CAST(${major} AS INTEGER) AND id > ${id}))")
    }

    fn rows(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}
