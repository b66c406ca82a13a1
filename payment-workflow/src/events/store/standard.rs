//! The event queries Postgres and SQLite share: the same SQL text (`$n` parameters, `ON CONFLICT`,
//! `RETURNING`), written once as one implementation of [`EventStore`] over [`StandardEvents`]. What differs —
//! how the log is kept in commit order, how a claim skips rows another transaction holds, how the dispatcher
//! runs alone — each backend's file says.

use onceflow_engine::{Conn, Store};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use super::{EventBatch, EventStore, Scope, plan};
use crate::events::model::{
    Attempt, AttemptOutcome, AttemptResult, Claimed, Delivery, DeliveryState, Endpoint, Event, EventType, NewDelivery,
    NewEvent, Position,
};
use crate::store::Sql;

/// A store whose database runs the standard event SQL of this file (Postgres, SQLite).
pub(super) trait StandardEvents: Store {
    /// The SQL of an event's position in the log (`major`, as a `bigint`).
    const POSITION: &'static str;
    /// The log's order.
    const ORDER: &'static str;
    /// Appended to a claim's `SELECT`: skip rows another transaction holds (nothing where one process writes).
    const SKIP_LOCKED: &'static str;
    /// Taken first in the dispatcher's transaction: `true` when this process may dispatch now.
    const DISPATCH_LOCK: Option<&'static str>;
    /// The dispatcher's cursor: `(major, event id)`.
    const DISPATCH_CURSOR: &'static str;
    /// Moves the dispatcher's cursor to `($1` as text, `$2)`.
    const MOVE_DISPATCH: &'static str;

    /// The condition "after the position `($major` as text, `$id)`, and no later commit can precede it".
    fn after(major: usize, id: usize) -> String;

    /// The rows a statement changed.
    fn rows(done: &<Self::Db as Database>::QueryResult) -> u64;
}

/// The columns of an event as [`Event`] reads them.
fn event_columns<S: StandardEvents>() -> String {
    format!("id, tenant, type, data, created_at, traceparent, {} AS position", S::POSITION)
}

impl<S> EventStore for S
where
    S: StandardEvents,
    for<'c> &'c mut <S::Db as Database>::Connection: Executor<'c, Database = S::Db>,
    <S::Db as Database>::Arguments: IntoArguments<S::Db>,
    for<'q> String: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> Option<String>: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> i64: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> Option<i64>: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> i32: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> Option<i32>: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> bool: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> EventType: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> DeliveryState: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> AttemptOutcome: Encode<'q, S::Db> + Type<S::Db>,
    for<'r> Event: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> Endpoint: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> Delivery: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> Attempt: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> Claimed: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64, String): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64, Option<i64>): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (String, String, i64, i64, bool): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (bool,): FromRow<'r, <S::Db as Database>::Row>,
{
    fn write_event<'c>(conn: &'c mut Conn<Self>, event: &NewEvent) -> Sql<'c, bool> {
        let event = event.clone();
        Box::pin(async move {
            let done = sqlx::query(
                "INSERT INTO events (id, tenant, type, data, created_at, traceparent) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING RETURNING 1",
            )
            .bind(event.id())
            .bind(event.tenant)
            .bind(event.kind)
            .bind(event.data)
            .bind(event.created_at)
            .bind(event.traceparent)
            .fetch_optional(conn)
            .await?;
            Ok(done.is_some())
        })
    }

    async fn events_after(
        &self,
        scope: Scope<'_>,
        after: &Position,
        types: &[EventType],
        limit: i64,
    ) -> Result<Vec<Event>, sqlx::Error> {
        // Parameters: the position ($1, $2), the limit ($3), the tenant ($4), then the types.
        let mut sql = format!("SELECT {} FROM events WHERE {}", event_columns::<S>(), S::after(1, 2));
        let mut next = 4;
        if scope.is_some() {
            sql.push_str(" AND tenant = $4");
            next = 5;
        }
        if !types.is_empty() {
            let list: Vec<String> = (next..next + types.len()).map(|n| format!("${n}")).collect();
            sql.push_str(&format!(" AND type IN ({})", list.join(", ")));
        }
        sql.push_str(&format!(" ORDER BY {} LIMIT $3", S::ORDER));
        let mut q =
            sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(after.major.to_string()).bind(after.id.clone()).bind(limit);
        if let Some(tenant) = scope {
            q = q.bind(tenant.to_owned());
        }
        for t in types {
            q = q.bind(*t);
        }
        q.fetch_all(self.pool()).await
    }

    async fn event(&self, id: &str) -> Result<Option<Event>, sqlx::Error> {
        let sql = format!("SELECT {} FROM events WHERE id = $1", event_columns::<S>());
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(id.to_owned()).fetch_optional(self.pool()).await
    }

    async fn horizon(&self, scope: Scope<'_>) -> Result<Option<Position>, sqlx::Error> {
        let found: Option<(i64, String)> = match scope {
            Some(tenant) => {
                sqlx::query_as("SELECT position, event_id FROM event_horizons WHERE tenant = $1")
                    .bind(tenant.to_owned())
                    .fetch_optional(self.pool())
                    .await?
            }
            None => {
                sqlx::query_as(
                    "SELECT position, event_id FROM event_horizons ORDER BY position DESC, event_id DESC LIMIT 1",
                )
                .fetch_optional(self.pool())
                .await?
            }
        };
        Ok(found.map(|(major, id)| Position { major, id }))
    }

    async fn insert_endpoint(&self, e: &Endpoint) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO webhook_endpoints (id, tenant, url, events, secret, previous_secret, previous_until, \
             enabled, disabled_reason, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(e.id.clone())
        .bind(e.tenant.clone())
        .bind(e.url.clone())
        .bind(e.events.clone())
        .bind(e.secret.clone())
        .bind(e.previous_secret.clone())
        .bind(e.previous_until)
        .bind(e.enabled)
        .bind(e.disabled_reason.clone())
        .bind(e.created_at)
        .bind(e.updated_at)
        .execute(self.write_pool())
        .await?;
        Ok(())
    }

    async fn endpoint(&self, id: &str) -> Result<Option<Endpoint>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM webhook_endpoints WHERE id = $1")
            .bind(id.to_owned())
            .fetch_optional(self.pool())
            .await
    }

    async fn endpoints(&self, scope: Scope<'_>, limit: i64) -> Result<Vec<Endpoint>, sqlx::Error> {
        match scope {
            Some(tenant) => {
                sqlx::query_as("SELECT * FROM webhook_endpoints WHERE tenant = $1 ORDER BY created_at, id LIMIT $2")
                    .bind(tenant.to_owned())
                    .bind(limit)
                    .fetch_all(self.pool())
                    .await
            }
            None => {
                sqlx::query_as("SELECT * FROM webhook_endpoints ORDER BY created_at, id LIMIT $1")
                    .bind(limit)
                    .fetch_all(self.pool())
                    .await
            }
        }
    }

    async fn update_endpoint(&self, e: &Endpoint) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE webhook_endpoints SET url = $2, events = $3, secret = $4, previous_secret = $5, \
             previous_until = $6, enabled = $7, disabled_reason = $8, updated_at = $9 WHERE id = $1",
        )
        .bind(e.id.clone())
        .bind(e.url.clone())
        .bind(e.events.clone())
        .bind(e.secret.clone())
        .bind(e.previous_secret.clone())
        .bind(e.previous_until)
        .bind(e.enabled)
        .bind(e.disabled_reason.clone())
        .bind(e.updated_at)
        .execute(self.write_pool())
        .await?;
        Ok(S::rows(&done) == 1)
    }

    async fn delete_endpoint(&self, id: &str, now: i64) -> Result<bool, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let done =
            sqlx::query("DELETE FROM webhook_endpoints WHERE id = $1").bind(id.to_owned()).execute(&mut *tx).await?;
        sqlx::query(
            "UPDATE webhook_deliveries SET state = 'failed', last_error = 'the endpoint was deleted', \
             updated_at = $2 WHERE endpoint_id = $1 AND state = 'pending'",
        )
        .bind(id.to_owned())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(S::rows(&done) == 1)
    }

    async fn insert_deliveries(&self, deliveries: &[NewDelivery]) -> Result<u64, sqlx::Error> {
        let mut conn = self.write_pool().acquire().await?;
        insert_deliveries::<S>(&mut conn, deliveries).await
    }

    async fn deliveries_of(&self, event_id: &str) -> Result<Vec<Delivery>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM webhook_deliveries WHERE event_id = $1 ORDER BY created_at, id")
            .bind(event_id.to_owned())
            .fetch_all(self.pool())
            .await
    }

    async fn attempts_of(
        &self,
        endpoint_id: &str,
        before: Option<&(i64, String, i32)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, sqlx::Error> {
        const ORDER: &str = " ORDER BY started_at DESC, delivery_id DESC, attempt DESC";
        match before {
            Some((at, delivery, attempt)) => {
                let sql = format!(
                    "SELECT * FROM webhook_attempts WHERE endpoint_id = $1 \
                     AND (started_at, delivery_id, attempt) < ($2, $3, $4){ORDER} LIMIT $5"
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(endpoint_id.to_owned())
                    .bind(*at)
                    .bind(delivery.clone())
                    .bind(*attempt)
                    .bind(limit)
                    .fetch_all(self.pool())
                    .await
            }
            None => {
                let sql = format!("SELECT * FROM webhook_attempts WHERE endpoint_id = $1{ORDER} LIMIT $2");
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(endpoint_id.to_owned())
                    .bind(limit)
                    .fetch_all(self.pool())
                    .await
            }
        }
    }

    async fn dispatch(&self, limit: i64, now: i64, schedule: &str) -> Result<u64, sqlx::Error> {
        // A look first, outside any transaction: an idle dispatcher takes no lock (SQLite: not the writer).
        let cursor: (i64, String) = sqlx::query_as(S::DISPATCH_CURSOR).fetch_one(self.pool()).await?;
        let cursor = Position { major: cursor.0, id: cursor.1 };
        if self.events_after(None, &cursor, &[], 1).await?.is_empty() {
            return Ok(0);
        }
        let mut tx = self.begin().await.map_err(engine)?;
        if let Some(lock) = S::DISPATCH_LOCK {
            let mine: bool = sqlx::query_scalar(lock).fetch_one(&mut *tx).await?;
            if !mine {
                return Ok(0);
            }
        }
        let (major, id): (i64, String) = sqlx::query_as(S::DISPATCH_CURSOR).fetch_one(&mut *tx).await?;
        let sql = format!(
            "SELECT {} FROM events WHERE {} ORDER BY {} LIMIT $3",
            event_columns::<S>(),
            S::after(1, 2),
            S::ORDER
        );
        let events: Vec<Event> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(major.to_string())
            .bind(id)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let Some(last) = events.last().map(Event::position) else { return Ok(0) };
        let endpoints: Vec<Endpoint> =
            sqlx::query_as("SELECT * FROM webhook_endpoints WHERE enabled = TRUE").fetch_all(&mut *tx).await?;
        insert_deliveries::<S>(&mut tx, &plan(&events, &endpoints, now, schedule)).await?;
        sqlx::query(S::MOVE_DISPATCH).bind(last.major.to_string()).bind(last.id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(events.len() as u64)
    }

    async fn due_endpoints(&self, now: i64) -> Result<Vec<String>, sqlx::Error> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT w.id FROM webhook_endpoints w WHERE w.enabled = TRUE AND EXISTS (SELECT 1 FROM webhook_deliveries d \
             WHERE d.endpoint_id = w.id AND d.state = 'pending' AND d.next_attempt_at <= $1)",
        )
        .bind(now)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn claim(
        &self,
        endpoint_id: &str,
        limit: i64,
        now: i64,
        lease_until: i64,
    ) -> Result<Vec<Claimed>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let sql = format!(
            "SELECT id FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at <= $2 \
             ORDER BY next_attempt_at LIMIT $3{}",
            S::SKIP_LOCKED
        );
        let ids: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(endpoint_id.to_owned())
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let mut claimed = Vec::new();
        for (id,) in ids {
            sqlx::query(
                "UPDATE webhook_deliveries SET attempts = attempts + 1, claim = claim + 1, next_attempt_at = $2, \
                 updated_at = $3 WHERE id = $1",
            )
            .bind(id.clone())
            .bind(lease_until)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE webhook_attempts SET outcome = 'abandoned', finished_at = $2, \
                 error = 'the process sending it stopped before it was answered' \
                 WHERE delivery_id = $1 AND outcome = 'in_flight'",
            )
            .bind(id.clone())
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO webhook_attempts (delivery_id, attempt, endpoint_id, event_id, tenant, outcome, started_at) \
                 SELECT id, attempts, endpoint_id, event_id, tenant, 'in_flight', $2 FROM webhook_deliveries WHERE id = $1",
            )
            .bind(id.clone())
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let row: Claimed = sqlx::query_as(CLAIMED).bind(id).fetch_one(&mut *tx).await?;
            claimed.push(row);
        }
        tx.commit().await?;
        Ok(claimed)
    }

    async fn finish(&self, c: &Claimed, r: &AttemptResult) -> Result<bool, sqlx::Error> {
        let d = &c.delivery;
        let mut tx = self.begin().await.map_err(engine)?;
        // What happened is recorded whatever became of the claim: the attempt was made.
        sqlx::query(
            "UPDATE webhook_attempts SET outcome = $3, finished_at = $4, status_code = $5, latency_ms = $6, \
             error = $7, next_attempt_at = $8 WHERE delivery_id = $1 AND attempt = $2 AND outcome = 'in_flight'",
        )
        .bind(d.id.clone())
        .bind(d.attempts)
        .bind(r.outcome)
        .bind(r.finished_at)
        .bind(r.status_code)
        .bind(r.latency_ms)
        .bind(r.error.clone())
        .bind(r.next_attempt_at)
        .execute(&mut *tx)
        .await?;
        let state = delivery_state(r);
        let moved = sqlx::query(
            "UPDATE webhook_deliveries SET state = $3, next_attempt_at = $4, last_status = $5, last_error = $6, \
             updated_at = $7 WHERE id = $1 AND claim = $2 AND state = 'pending'",
        )
        .bind(d.id.clone())
        .bind(d.claim)
        .bind(state)
        .bind(r.next_attempt_at.unwrap_or(r.finished_at))
        .bind(r.status_code)
        .bind(r.error.clone())
        .bind(r.finished_at)
        .execute(&mut *tx)
        .await?;
        if r.gone {
            sqlx::query(
                "UPDATE webhook_endpoints SET enabled = FALSE, disabled_reason = 'gone', updated_at = $2 \
                 WHERE id = $1 AND enabled = TRUE",
            )
            .bind(d.endpoint_id.clone())
            .bind(r.finished_at)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE webhook_deliveries SET state = 'failed', last_error = $3, updated_at = $2 \
                 WHERE endpoint_id = $1 AND state = 'pending'",
            )
            .bind(d.endpoint_id.clone())
            .bind(r.finished_at)
            .bind(GONE.to_owned())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(S::rows(&moved) == 1)
    }

    async fn pending(&self) -> Result<(i64, Option<i64>), sqlx::Error> {
        sqlx::query_as("SELECT count(*), min(created_at) FROM webhook_deliveries WHERE state = 'pending'")
            .fetch_one(self.pool())
            .await
    }

    async fn delete_events(
        &self,
        from: &mut Position,
        by: i64,
        limit: i64,
        dry_run: bool,
    ) -> Result<EventBatch, sqlx::Error> {
        let (major, id): (i64, String) = sqlx::query_as(S::DISPATCH_CURSOR).fetch_one(self.pool()).await?;
        let dispatched = Position { major, id };
        let sql = format!(
            "SELECT id, tenant, {} AS position, created_at, EXISTS (SELECT 1 FROM webhook_deliveries d \
             WHERE d.event_id = events.id AND d.state = 'pending') AS pending FROM events WHERE {} ORDER BY {} LIMIT $3",
            S::POSITION,
            S::after(1, 2),
            S::ORDER
        );
        let window: Vec<(String, String, i64, i64, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(from.major.to_string())
            .bind(from.id.clone())
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        let (doomed, done) = choose(&window, &dispatched, by, limit, from);
        if dry_run || doomed.is_empty() {
            return Ok(EventBatch { deleted: doomed.len() as u64, done });
        }
        let mut tx = self.begin().await.map_err(engine)?;
        let mut deleted = 0;
        for (id, _, _) in &doomed {
            sqlx::query(
                "DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM webhook_deliveries \
                 WHERE event_id = $1 AND state <> 'pending')",
            )
            .bind(id.clone())
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE event_id = $1 AND state <> 'pending'")
                .bind(id.clone())
                .execute(&mut *tx)
                .await?;
            // A redelivery asked for meanwhile keeps its event.
            let done = sqlx::query(
                "DELETE FROM events WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d \
                 WHERE d.event_id = $1 AND d.state = 'pending')",
            )
            .bind(id.clone())
            .execute(&mut *tx)
            .await?;
            deleted += S::rows(&done);
        }
        for (tenant, position) in horizons(&doomed) {
            sqlx::query(
                "INSERT INTO event_horizons (tenant, position, event_id) VALUES ($1, $2, $3) ON CONFLICT (tenant) \
                 DO UPDATE SET position = excluded.position, event_id = excluded.event_id \
                 WHERE (event_horizons.position, event_horizons.event_id) < (excluded.position, excluded.event_id)",
            )
            .bind(tenant)
            .bind(position.major)
            .bind(position.id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(EventBatch { deleted, done })
    }
}

/// A claimed delivery with its endpoint and event (`$1`: the delivery).
pub(super) const CLAIMED: &str = "SELECT d.*, w.url, w.secret, w.previous_secret, w.previous_until, \
     e.type AS event_type, e.data AS event_data, e.created_at AS event_created_at, e.traceparent \
     FROM webhook_deliveries d JOIN webhook_endpoints w ON w.id = d.endpoint_id JOIN events e ON e.id = d.event_id \
     WHERE d.id = $1";

/// Why a `410` failed the endpoint's pending deliveries.
pub(super) const GONE: &str = "the endpoint answered 410 Gone and was disabled";

/// Where an attempt leaves its delivery.
pub(super) fn delivery_state(r: &AttemptResult) -> DeliveryState {
    match (r.outcome, r.next_attempt_at) {
        (AttemptOutcome::Delivered, _) => DeliveryState::Delivered,
        (_, Some(_)) => DeliveryState::Pending,
        (_, None) => DeliveryState::Failed,
    }
}

/// Of a retention window (`(id, tenant, position, created_at, pending)` in log order), the events to delete —
/// old enough, passed by the dispatcher, nothing pending — and whether the pass is done (it reached an event too
/// young or not yet dispatched, or the end of the log). `from` moves past what was looked at.
pub(super) fn choose(
    window: &[(String, String, i64, i64, bool)],
    dispatched: &Position,
    by: i64,
    limit: i64,
    from: &mut Position,
) -> (Vec<(String, String, Position)>, bool) {
    let mut doomed = Vec::new();
    for (id, tenant, major, created_at, pending) in window {
        let position = Position { major: *major, id: id.clone() };
        if *created_at > by || position > *dispatched {
            return (doomed, true);
        }
        *from = position.clone();
        if !pending {
            doomed.push((id.clone(), tenant.clone(), position));
        }
    }
    (doomed, (window.len() as i64) < limit)
}

/// Each tenant's newest deleted position.
pub(super) fn horizons(doomed: &[(String, String, Position)]) -> Vec<(String, Position)> {
    let mut newest: std::collections::BTreeMap<String, Position> = std::collections::BTreeMap::new();
    for (_, tenant, position) in doomed {
        let entry = newest.entry(tenant.clone()).or_default();
        if *position > *entry {
            *entry = position.clone();
        }
    }
    newest.into_iter().collect()
}

/// The database error inside an engine error (beginning a transaction fails only on the database).
pub(super) fn engine(e: onceflow_engine::Error) -> sqlx::Error {
    match e {
        onceflow_engine::Error::Database(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

/// Inserts `deliveries` on `conn`, skipping ids that exist; how many it inserted.
async fn insert_deliveries<S>(conn: &mut Conn<S>, deliveries: &[NewDelivery]) -> Result<u64, sqlx::Error>
where
    S: StandardEvents,
    for<'c> &'c mut <S::Db as Database>::Connection: Executor<'c, Database = S::Db>,
    <S::Db as Database>::Arguments: IntoArguments<S::Db>,
    for<'q> String: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> i64: Encode<'q, S::Db> + Type<S::Db>,
{
    let mut made = 0;
    for d in deliveries {
        let done = sqlx::query(
            "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, tenant, state, attempts, claim, \
             next_attempt_at, schedule, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 'pending', 0, 0, $5, $6, $5, $5) ON CONFLICT (id) DO NOTHING",
        )
        .bind(d.id.clone())
        .bind(d.event_id.clone())
        .bind(d.endpoint_id.clone())
        .bind(d.tenant.clone())
        .bind(d.due)
        .bind(d.schedule.clone())
        .execute(&mut *conn)
        .await?;
        made += S::rows(&done);
    }
    Ok(made)
}
