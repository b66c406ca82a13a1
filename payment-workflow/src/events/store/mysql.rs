//! Events on MySQL / MariaDB: `?` parameters bound in the order they appear, a duplicate key read as "exists",
//! and the log's order given after commit by the sequencer (see the migration): an `AUTO_INCREMENT` is taken at
//! insert, not at commit, so it cannot order a log that readers page through while writers commit.

use onceflow_engine::{Conn, MySqlStore, Store};

use super::standard::{CLAIMED, GONE, choose, delivery_state, engine, horizons};
use super::{EventBatch, EventStore, Scope, plan};
use crate::events::model::{
    Attempt, AttemptResult, Claimed, Delivery, Endpoint, Event, EventType, NewDelivery, NewEvent, Position,
};
use crate::store::Sql;

/// The columns of an event as [`Event`] reads them.
const EVENT: &str = "id, tenant, type, data, created_at, traceparent, seq AS position";

/// Events the sequencer numbers per transaction.
const SEQUENCE_BATCH: i64 = 500;

/// `Ok(false)` for a duplicate key, `Ok(true)` for an insert.
fn inserted(result: Result<sqlx::mysql::MySqlQueryResult, sqlx::Error>) -> Result<bool, sqlx::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(false),
        Err(e) => Err(e),
    }
}

/// `events_after`'s SQL: numbered events after `$position` (MySQL numbers are unique), of a tenant, of types.
fn after_sql(scoped: bool, types: usize) -> String {
    let mut sql = format!("SELECT {EVENT} FROM events WHERE seq > ?");
    if scoped {
        sql.push_str(" AND tenant = ?");
    }
    if types > 0 {
        sql.push_str(&format!(" AND type IN ({})", vec!["?"; types].join(", ")));
    }
    sql.push_str(" ORDER BY seq LIMIT ?");
    sql
}

impl EventStore for MySqlStore {
    fn write_event<'c>(conn: &'c mut Conn<Self>, event: &NewEvent) -> Sql<'c, bool> {
        let event = event.clone();
        Box::pin(async move {
            // A duplicate id rolls back this statement only: the outcome's transaction goes on.
            let done = sqlx::query(
                "INSERT INTO events (id, tenant, type, data, created_at, traceparent) VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(event.id())
            .bind(&event.tenant)
            .bind(event.kind)
            .bind(&event.data)
            .bind(event.created_at)
            .bind(&event.traceparent)
            .execute(conn)
            .await;
            Ok(inserted(done)?)
        })
    }

    async fn sequence(&self) -> Result<u64, sqlx::Error> {
        let waiting: Option<String> =
            sqlx::query_scalar("SELECT id FROM events WHERE seq IS NULL LIMIT 1").fetch_optional(self.pool()).await?;
        if waiting.is_none() {
            return Ok(0);
        }
        let mut tx = self.begin().await.map_err(engine)?;
        // The row lock makes this the only sequencer until it commits; the events it reads next are every one
        // committed by then (READ COMMITTED), each numbered above everything numbered before.
        let last: i64 = sqlx::query_scalar("SELECT position FROM event_sequence WHERE id = 1 FOR UPDATE")
            .fetch_one(&mut *tx)
            .await?;
        let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM events WHERE seq IS NULL ORDER BY n LIMIT ?")
            .bind(SEQUENCE_BATCH)
            .fetch_all(&mut *tx)
            .await?;
        let mut next = last;
        for id in &ids {
            next += 1;
            sqlx::query("UPDATE events SET seq = ? WHERE id = ? AND seq IS NULL")
                .bind(next)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("UPDATE event_sequence SET position = ? WHERE id = 1").bind(next).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(ids.len() as u64)
    }

    async fn events_after(
        &self,
        scope: Scope<'_>,
        after: &Position,
        types: &[EventType],
        limit: i64,
    ) -> Result<Vec<Event>, sqlx::Error> {
        let sql = after_sql(scope.is_some(), types.len());
        let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(after.major);
        if let Some(tenant) = scope {
            q = q.bind(tenant.to_owned());
        }
        for t in types {
            q = q.bind(*t);
        }
        q.bind(limit).fetch_all(self.pool()).await
    }

    async fn event(&self, id: &str) -> Result<Option<Event>, sqlx::Error> {
        // Committed but not numbered yet, an event is still one: its place in the log is unknown (0) until then.
        let sql = format!("SELECT {} FROM events WHERE id = ?", EVENT.replace("seq AS", "COALESCE(seq, 0) AS"));
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(self.pool()).await
    }

    async fn horizon(&self, scope: Scope<'_>) -> Result<Option<Position>, sqlx::Error> {
        let found: Option<(i64, String)> = match scope {
            Some(tenant) => {
                sqlx::query_as("SELECT position, event_id FROM event_horizons WHERE tenant = ?")
                    .bind(tenant)
                    .fetch_optional(self.pool())
                    .await?
            }
            None => {
                sqlx::query_as("SELECT position, event_id FROM event_horizons ORDER BY position DESC LIMIT 1")
                    .fetch_optional(self.pool())
                    .await?
            }
        };
        Ok(found.map(|(major, id)| Position { major, id }))
    }

    async fn insert_endpoint(&self, e: &Endpoint) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO webhook_endpoints (id, tenant, url, events, secret, previous_secret, previous_until, \
             enabled, disabled_reason, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&e.id)
        .bind(&e.tenant)
        .bind(&e.url)
        .bind(&e.events)
        .bind(&e.secret)
        .bind(&e.previous_secret)
        .bind(e.previous_until)
        .bind(e.enabled)
        .bind(&e.disabled_reason)
        .bind(e.created_at)
        .bind(e.updated_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn endpoint(&self, id: &str) -> Result<Option<Endpoint>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM webhook_endpoints WHERE id = ?").bind(id).fetch_optional(self.pool()).await
    }

    async fn endpoints(&self, scope: Scope<'_>, limit: i64) -> Result<Vec<Endpoint>, sqlx::Error> {
        match scope {
            Some(tenant) => {
                sqlx::query_as("SELECT * FROM webhook_endpoints WHERE tenant = ? ORDER BY created_at, id LIMIT ?")
                    .bind(tenant)
                    .bind(limit)
                    .fetch_all(self.pool())
                    .await
            }
            None => {
                sqlx::query_as("SELECT * FROM webhook_endpoints ORDER BY created_at, id LIMIT ?")
                    .bind(limit)
                    .fetch_all(self.pool())
                    .await
            }
        }
    }

    async fn update_endpoint(&self, e: &Endpoint) -> Result<bool, sqlx::Error> {
        // MySQL counts rows matched (the client's FOUND_ROWS flag), so an update to the same values is found.
        let done = sqlx::query(
            "UPDATE webhook_endpoints SET url = ?, events = ?, secret = ?, previous_secret = ?, previous_until = ?, \
             enabled = ?, disabled_reason = ?, updated_at = ? WHERE id = ?",
        )
        .bind(&e.url)
        .bind(&e.events)
        .bind(&e.secret)
        .bind(&e.previous_secret)
        .bind(e.previous_until)
        .bind(e.enabled)
        .bind(&e.disabled_reason)
        .bind(e.updated_at)
        .bind(&e.id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_endpoint(&self, id: &str, now: i64) -> Result<bool, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let done = sqlx::query("DELETE FROM webhook_endpoints WHERE id = ?").bind(id).execute(&mut *tx).await?;
        sqlx::query(
            "UPDATE webhook_deliveries SET state = 'failed', last_error = 'the endpoint was deleted', updated_at = ? \
             WHERE state = 'pending' AND endpoint_id = ?",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_deliveries(&self, deliveries: &[NewDelivery]) -> Result<u64, sqlx::Error> {
        let mut conn = self.pool().acquire().await?;
        insert_deliveries(&mut conn, deliveries).await
    }

    async fn deliveries_of(&self, event_id: &str) -> Result<Vec<Delivery>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM webhook_deliveries WHERE event_id = ? ORDER BY created_at, id")
            .bind(event_id)
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
                // Spelled out: MariaDB reads a row comparison through an index less well.
                let sql = format!(
                    "SELECT * FROM webhook_attempts WHERE endpoint_id = ? AND (started_at < ? OR (started_at = ? \
                     AND (delivery_id < ? OR (delivery_id = ? AND attempt < ?)))){ORDER} LIMIT ?"
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(endpoint_id)
                    .bind(*at)
                    .bind(*at)
                    .bind(delivery)
                    .bind(delivery)
                    .bind(*attempt)
                    .bind(limit)
                    .fetch_all(self.pool())
                    .await
            }
            None => {
                let sql = format!("SELECT * FROM webhook_attempts WHERE endpoint_id = ?{ORDER} LIMIT ?");
                sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(endpoint_id).bind(limit).fetch_all(self.pool()).await
            }
        }
    }

    async fn dispatch(&self, limit: i64, now: i64, schedule: &str) -> Result<u64, sqlx::Error> {
        self.sequence().await?;
        let (major, _): (i64, String) =
            sqlx::query_as("SELECT position, event_id FROM event_dispatch WHERE id = 1").fetch_one(self.pool()).await?;
        let cursor = Position { major, id: String::new() };
        if self.events_after(None, &cursor, &[], 1).await?.is_empty() {
            return Ok(0);
        }
        let mut tx = self.begin().await.map_err(engine)?;
        // The cursor's row, locked: one dispatcher at a time; another process skips its turn.
        let cursor: Option<(i64, String)> =
            sqlx::query_as("SELECT position, event_id FROM event_dispatch WHERE id = 1 FOR UPDATE SKIP LOCKED")
                .fetch_optional(&mut *tx)
                .await?;
        let Some((major, _)) = cursor else { return Ok(0) };
        let events: Vec<Event> = sqlx::query_as(sqlx::AssertSqlSafe(after_sql(false, 0)))
            .bind(major)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let Some(last) = events.last().map(Event::position) else { return Ok(0) };
        let endpoints: Vec<Endpoint> =
            sqlx::query_as("SELECT * FROM webhook_endpoints WHERE enabled = TRUE").fetch_all(&mut *tx).await?;
        insert_deliveries(&mut tx, &plan(&events, &endpoints, now, schedule)).await?;
        sqlx::query("UPDATE event_dispatch SET position = ?, event_id = ? WHERE id = 1")
            .bind(last.major)
            .bind(&last.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(events.len() as u64)
    }

    async fn due_endpoints(&self, now: i64) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT w.id FROM webhook_endpoints w WHERE w.enabled = TRUE AND EXISTS (SELECT 1 FROM webhook_deliveries d \
             WHERE d.state = 'pending' AND d.endpoint_id = w.id AND d.next_attempt_at <= ?)",
        )
        .bind(now)
        .fetch_all(self.pool())
        .await
    }

    async fn claim(
        &self,
        endpoint_id: &str,
        limit: i64,
        now: i64,
        lease_until: i64,
    ) -> Result<Vec<Claimed>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM webhook_deliveries WHERE state = 'pending' AND endpoint_id = ? AND next_attempt_at <= ? \
             ORDER BY next_attempt_at LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(endpoint_id)
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut claimed = Vec::new();
        for id in ids {
            sqlx::query(
                "UPDATE webhook_deliveries SET attempts = attempts + 1, claim = claim + 1, next_attempt_at = ?, \
                 updated_at = ? WHERE id = ?",
            )
            .bind(lease_until)
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE webhook_attempts SET outcome = 'abandoned', finished_at = ?, \
                 error = 'the process sending it stopped before it was answered' \
                 WHERE delivery_id = ? AND outcome = 'in_flight'",
            )
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO webhook_attempts (delivery_id, attempt, endpoint_id, event_id, tenant, outcome, started_at) \
                 SELECT id, attempts, endpoint_id, event_id, tenant, 'in_flight', ? FROM webhook_deliveries WHERE id = ?",
            )
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            let row: Claimed =
                sqlx::query_as(sqlx::AssertSqlSafe(CLAIMED.replace("$1", "?"))).bind(id).fetch_one(&mut *tx).await?;
            claimed.push(row);
        }
        tx.commit().await?;
        Ok(claimed)
    }

    async fn finish(&self, c: &Claimed, r: &AttemptResult) -> Result<bool, sqlx::Error> {
        let d = &c.delivery;
        let mut tx = self.begin().await.map_err(engine)?;
        sqlx::query(
            "UPDATE webhook_attempts SET outcome = ?, finished_at = ?, status_code = ?, latency_ms = ?, error = ?, \
             next_attempt_at = ? WHERE delivery_id = ? AND attempt = ? AND outcome = 'in_flight'",
        )
        .bind(r.outcome)
        .bind(r.finished_at)
        .bind(r.status_code)
        .bind(r.latency_ms)
        .bind(&r.error)
        .bind(r.next_attempt_at)
        .bind(&d.id)
        .bind(d.attempts)
        .execute(&mut *tx)
        .await?;
        let moved = sqlx::query(
            "UPDATE webhook_deliveries SET state = ?, next_attempt_at = ?, last_status = ?, last_error = ?, \
             updated_at = ? WHERE id = ? AND claim = ? AND state = 'pending'",
        )
        .bind(delivery_state(r))
        .bind(r.next_attempt_at.unwrap_or(r.finished_at))
        .bind(r.status_code)
        .bind(&r.error)
        .bind(r.finished_at)
        .bind(&d.id)
        .bind(d.claim)
        .execute(&mut *tx)
        .await?;
        if r.gone {
            sqlx::query(
                "UPDATE webhook_endpoints SET enabled = FALSE, disabled_reason = 'gone', updated_at = ? \
                 WHERE id = ? AND enabled = TRUE",
            )
            .bind(r.finished_at)
            .bind(&d.endpoint_id)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE webhook_deliveries SET state = 'failed', last_error = ?, updated_at = ? \
                 WHERE state = 'pending' AND endpoint_id = ?",
            )
            .bind(GONE)
            .bind(r.finished_at)
            .bind(&d.endpoint_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(moved.rows_affected() == 1)
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
        let (major, id): (i64, String) =
            sqlx::query_as("SELECT position, event_id FROM event_dispatch WHERE id = 1").fetch_one(self.pool()).await?;
        let dispatched = Position { major, id };
        let window: Vec<(String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT id, tenant, seq, created_at, CAST(EXISTS (SELECT 1 FROM webhook_deliveries d \
             WHERE d.event_id = events.id AND d.state = 'pending') AS SIGNED) FROM events WHERE seq > ? \
             ORDER BY seq LIMIT ?",
        )
        .bind(from.major)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let window: Vec<_> = window.into_iter().map(|(i, t, p, c, pending)| (i, t, p, c, pending != 0)).collect();
        let (doomed, done) = choose(&window, &dispatched, by, limit, from);
        if dry_run || doomed.is_empty() {
            return Ok(EventBatch { deleted: doomed.len() as u64, done });
        }
        let mut tx = self.begin().await.map_err(engine)?;
        let mut deleted = 0;
        for (id, _, _) in &doomed {
            sqlx::query(
                "DELETE a FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id \
                 WHERE d.event_id = ? AND d.state <> 'pending'",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE event_id = ? AND state <> 'pending'")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let pending: Option<String> = sqlx::query_scalar(
                "SELECT id FROM webhook_deliveries WHERE event_id = ? AND state = 'pending' LIMIT 1",
            )
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            // A redelivery asked for meanwhile keeps its event.
            if pending.is_none() {
                deleted +=
                    sqlx::query("DELETE FROM events WHERE id = ?").bind(id).execute(&mut *tx).await?.rows_affected();
            }
        }
        for (tenant, position) in horizons(&doomed) {
            sqlx::query(
                "INSERT INTO event_horizons (tenant, position, event_id) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE \
                 event_id = IF(VALUES(position) > position, VALUES(event_id), event_id), \
                 position = GREATEST(position, VALUES(position))",
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

/// Inserts `deliveries` on `conn`, skipping ids that exist; how many it inserted.
async fn insert_deliveries(conn: &mut sqlx::MySqlConnection, deliveries: &[NewDelivery]) -> Result<u64, sqlx::Error> {
    let mut made = 0;
    for d in deliveries {
        let done = sqlx::query(
            "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, tenant, state, attempts, claim, \
             next_attempt_at, schedule, created_at, updated_at) VALUES (?, ?, ?, ?, 'pending', 0, 0, ?, ?, ?, ?)",
        )
        .bind(&d.id)
        .bind(&d.event_id)
        .bind(&d.endpoint_id)
        .bind(&d.tenant)
        .bind(d.due)
        .bind(&d.schedule)
        .bind(d.due)
        .bind(d.due)
        .execute(&mut *conn)
        .await;
        made += u64::from(inserted(done)?);
    }
    Ok(made)
}
