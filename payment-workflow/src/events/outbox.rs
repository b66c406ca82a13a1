//! The outbox: an outcome's event written by the outcome's own commit, so that there is no outcome without its
//! event and no event without its outcome, whatever crashes in between. Two forms, one per way a backend writes
//! a saga's phase:
//!
//! - in a statement phase (Postgres, SQLite): [`phase_insert`] is the `INSERT` of one more write of the phase —
//!   the store makes it one more data-modifying CTE of its single statement on Postgres, one more statement of
//!   its call on SQLite (`PhaseDialect::write`) — made only when the phase's own condition holds (the outcome's
//!   write happened);
//! - in a transaction (closure steps, every backend: MySQL's phases, any backend's compensations):
//!   [`crate::EventStore::write_event`] on the step's connection.
//!
//! Either way the event's id is derived from its outcome ([`crate::NewEvent::id`]) and unique in the table, so
//! a second write of one outcome makes no second event. The row is small (id, tenant, type, the data, a time)
//! and nothing else is read or written in the outcome's commit: the dispatcher turns committed events into
//! deliveries later, in the background.

use onceflow_engine::phase::SqlArg;

use super::model::NewEvent;

/// The `INSERT` that writes `event` when the SQL boolean `condition` holds, for a statement phase of Postgres or
/// SQLite; its values are appended to `args` (so its parameters follow the phase's own). The store makes it one
/// of the phase's writes, named as it likes — `d.write("p_event", &sql)` — and `d.wrote("p_event")` then tells
/// the parts after it (and the phase's guard or step outputs) whether it wrote: false both when `condition` did
/// not hold and when the outcome's event exists. (The dialect stays with the store: the events sit below it.)
pub fn phase_insert(event: &NewEvent, condition: &str, args: &mut Vec<SqlArg>) -> String {
    let sql = phase_insert_sql(args.len() + 1, condition);
    phase_insert_args(event, args);
    sql
}

/// [`phase_insert`]'s SQL alone, its parameters from `$first`: the same for every event, so a phase built for
/// every payment builds it once and appends each event's values with [`phase_insert_args`].
pub fn phase_insert_sql(first: usize, condition: &str) -> String {
    let p = |i: usize| format!("${}", first + i);
    format!(
        "INSERT INTO events (id, tenant, type, data, created_at, traceparent) \
         SELECT {}, {}, {}, {}, {}, NULLIF({}, '') WHERE {condition} ON CONFLICT (id) DO NOTHING",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5)
    )
}

/// [`phase_insert`]'s values of `event`, appended to `args` in the order of [`phase_insert_sql`]'s parameters.
pub fn phase_insert_args(event: &NewEvent, args: &mut Vec<SqlArg>) {
    args.extend([
        SqlArg::Text(event.id()),
        SqlArg::Text(event.tenant.clone()),
        SqlArg::Text(event.kind.as_str().to_owned()),
        SqlArg::Text(event.data.clone()),
        SqlArg::Int(event.created_at),
        SqlArg::Text(event.traceparent.clone().unwrap_or_default()),
    ]);
}
