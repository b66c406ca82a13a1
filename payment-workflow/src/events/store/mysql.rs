//! Events on MySQL / MariaDB: `?` parameters bound in the order they appear, a duplicate key read as "exists",
//! and the log's order given after commit by the sequencer (see the migration): an `AUTO_INCREMENT` is taken at
//! insert, not at commit, so it cannot order a log that readers page through while writers commit. A delivery's
//! due time is the server's clock, `CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)` (ms), the same for every
//! process.

use onceflow_engine::{Conn, MySqlStore, Store};
use sqlx::MySqlConnection;

use super::{
    ABANDONED, DELETED, DISABLED, EVENT_GONE, EventBatch, EventStore, GONE, LogPage, LogRow, STRANDED, Scope, Sql,
    UNSENT, choose, delivery_state, engine, horizons, log_page, plan,
};
use crate::events::model::{
    Attempt, AttemptResult, Claimed, Delivery, Endpoint, EndpointChange, Event, EventType, NewDelivery, NewEvent,
    Position,
};

/// The columns of an event as [`Event`] reads them, numbered by the sequencer.
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

/// `n` placeholders, for an `IN` list.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Binds each of `values` to `query`, in order.
macro_rules! bind_all {
    ($query:expr, $values:expr) => {{
        let mut q = $query;
        for v in $values {
            q = q.bind(v);
        }
        q
    }};
}

/// The log's query: up to `?` (third) numbered events after the position `?` (of the tenant `?` when `scoped`,
/// of `types` types), then the newest numbered event of the tenant (any type, `tail` 1) — in one statement, so
/// both see the same log. Parameters: the position, [the tenant], [the types], the limit, the position again,
/// [the tenant].
fn log_sql(scoped: bool, types: usize) -> String {
    let tenant = if scoped { " AND tenant = ?" } else { "" };
    let kinds = if types == 0 { String::new() } else { format!(" AND type IN ({})", marks(types)) };
    format!(
        "(SELECT {EVENT}, 0 AS tail FROM events WHERE seq > ?{tenant}{kinds} ORDER BY seq LIMIT ?) \
         UNION ALL (SELECT {EVENT}, 1 AS tail FROM events WHERE seq > ?{tenant} ORDER BY seq DESC LIMIT 1) \
         ORDER BY tail, position"
    )
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
    ) -> Result<LogPage, sqlx::Error> {
        let sql = log_sql(scope.is_some(), types.len());
        let mut q = sqlx::query_as::<_, LogRow>(sqlx::AssertSqlSafe(sql)).bind(after.major);
        if let Some(tenant) = scope {
            q = q.bind(tenant.to_owned());
        }
        for t in types {
            q = q.bind(*t);
        }
        q = q.bind(limit).bind(after.major);
        if let Some(tenant) = scope {
            q = q.bind(tenant.to_owned());
        }
        Ok(log_page(q.fetch_all(self.pool()).await?, limit))
    }

    async fn event(&self, id: &str) -> Result<Option<Event>, sqlx::Error> {
        // Committed but not numbered yet, an event is still one: its place in the log is unknown (0) until then.
        sqlx::query_as(
            "SELECT id, tenant, type, data, created_at, traceparent, COALESCE(seq, 0) AS position FROM events \
             WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
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

    async fn update_endpoint(
        &self,
        id: &str,
        change: &EndpointChange,
        now: i64,
    ) -> Result<Option<Endpoint>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        // Assignments run left to right on MySQL: `disabled_reason` reads the parameter, not the new `enabled`.
        sqlx::query(
            "UPDATE webhook_endpoints SET url = COALESCE(?, url), events = IF(?, ?, events), \
             disabled_reason = CASE WHEN ? IS NULL THEN disabled_reason WHEN ? THEN NULL ELSE 'disabled' END, \
             enabled = COALESCE(?, enabled), updated_at = ? WHERE id = ?",
        )
        .bind(&change.url)
        .bind(change.events.is_some())
        .bind(change.events.clone().flatten())
        .bind(change.enabled)
        .bind(change.enabled)
        .bind(change.enabled)
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let endpoint: Option<Endpoint> =
            sqlx::query_as("SELECT * FROM webhook_endpoints WHERE id = ?").bind(id).fetch_optional(&mut *tx).await?;
        if endpoint.is_some() && change.enabled == Some(false) {
            fail_pending(&mut tx, id, DISABLED, now).await?;
        }
        tx.commit().await?;
        Ok(endpoint)
    }

    async fn rotate_secret(
        &self,
        id: &str,
        secret: &str,
        until: i64,
        now: i64,
    ) -> Result<Option<Endpoint>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        // One statement, assignments left to right: the row's own secret becomes the previous one first.
        sqlx::query(
            "UPDATE webhook_endpoints SET previous_secret = secret, secret = ?, previous_until = ?, updated_at = ? \
             WHERE id = ?",
        )
        .bind(secret)
        .bind(until)
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let endpoint =
            sqlx::query_as("SELECT * FROM webhook_endpoints WHERE id = ?").bind(id).fetch_optional(&mut *tx).await?;
        tx.commit().await?;
        Ok(endpoint)
    }

    async fn delete_endpoint(&self, id: &str, now: i64) -> Result<bool, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let done = sqlx::query("DELETE FROM webhook_endpoints WHERE id = ?").bind(id).execute(&mut *tx).await?;
        fail_pending(&mut tx, id, DELETED, now).await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_deliveries(&self, deliveries: &[NewDelivery]) -> Result<Vec<bool>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let mut made = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            // Locked for share until the insert commits (see `EventStore::insert_deliveries`).
            let event: Option<String> = sqlx::query_scalar("SELECT id FROM events WHERE id = ? LOCK IN SHARE MODE")
                .bind(&d.event_id)
                .fetch_optional(&mut *tx)
                .await?;
            let endpoint: Option<String> = sqlx::query_scalar(
                "SELECT id FROM webhook_endpoints WHERE id = ? AND tenant = ? AND enabled = TRUE LOCK IN SHARE MODE",
            )
            .bind(&d.endpoint_id)
            .bind(&d.tenant)
            .fetch_optional(&mut *tx)
            .await?;
            made.push(event.is_some() && endpoint.is_some() && insert_delivery(&mut tx, d).await?);
        }
        tx.commit().await?;
        Ok(made)
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
        match before {
            Some((at, delivery, attempt)) => {
                // Spelled out: MariaDB reads a row comparison through an index less well.
                sqlx::query_as(
                    "SELECT * FROM webhook_attempts WHERE endpoint_id = ? AND (started_at < ? OR (started_at = ? \
                     AND (delivery_id < ? OR (delivery_id = ? AND attempt < ?)))) \
                     ORDER BY started_at DESC, delivery_id DESC, attempt DESC LIMIT ?",
                )
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
                sqlx::query_as(
                    "SELECT * FROM webhook_attempts WHERE endpoint_id = ? \
                     ORDER BY started_at DESC, delivery_id DESC, attempt DESC LIMIT ?",
                )
                .bind(endpoint_id)
                .bind(limit)
                .fetch_all(self.pool())
                .await
            }
        }
    }

    async fn dispatch(&self, limit: i64, now: i64, schedule: &str) -> Result<u64, sqlx::Error> {
        self.sequence().await?;
        let (major, _): (i64, String) =
            sqlx::query_as("SELECT position, event_id FROM event_dispatch WHERE id = 1").fetch_one(self.pool()).await?;
        let waiting: Option<String> = sqlx::query_scalar("SELECT id FROM events WHERE seq > ? ORDER BY seq LIMIT 1")
            .bind(major)
            .fetch_optional(self.pool())
            .await?;
        if waiting.is_none() {
            return Ok(0);
        }
        let mut tx = self.begin().await.map_err(engine)?;
        // The cursor's row, locked: one dispatcher at a time; another process skips its turn.
        let cursor: Option<(i64, String)> =
            sqlx::query_as("SELECT position, event_id FROM event_dispatch WHERE id = 1 FOR UPDATE SKIP LOCKED")
                .fetch_optional(&mut *tx)
                .await?;
        let Some((major, _)) = cursor else { return Ok(0) };
        let events: Vec<Event> = sqlx::query_as(
            "SELECT id, tenant, type, data, created_at, traceparent, seq AS position FROM events WHERE seq > ? \
             ORDER BY seq LIMIT ?",
        )
        .bind(major)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let Some(last) = events.last().map(Event::position) else { return Ok(0) };
        let mut tenants: Vec<String> = events.iter().map(|e| e.tenant.clone()).collect();
        tenants.sort();
        tenants.dedup();
        // Locked for share until the deliveries commit: an endpoint deleted or disabled meanwhile waits, then
        // fails them; one deleted or disabled before is not read.
        let sql = format!(
            "SELECT * FROM webhook_endpoints WHERE enabled = TRUE AND tenant IN ({}) LOCK IN SHARE MODE",
            marks(tenants.len())
        );
        let endpoints: Vec<Endpoint> =
            bind_all!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), &tenants).fetch_all(&mut *tx).await?;
        for d in plan(&events, &endpoints, now, schedule) {
            insert_delivery(&mut tx, &d).await?;
        }
        sqlx::query("UPDATE event_dispatch SET position = ?, event_id = ? WHERE id = 1")
            .bind(last.major)
            .bind(&last.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(events.len() as u64)
    }

    async fn due_endpoints(&self) -> Result<Vec<(String, String)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT w.id, w.tenant FROM webhook_endpoints w WHERE w.enabled = TRUE AND EXISTS (SELECT 1 \
             FROM webhook_deliveries d WHERE d.state = 'pending' AND d.endpoint_id = w.id \
             AND d.next_attempt_at <= CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED))",
        )
        .fetch_all(self.pool())
        .await
    }

    async fn claim(&self, endpoint_id: &str, limit: i64, now: i64, lease_ms: i64) -> Result<Vec<Claimed>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM webhook_deliveries WHERE state = 'pending' AND endpoint_id = ? \
             AND next_attempt_at <= CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) \
             ORDER BY next_attempt_at LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(endpoint_id)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = marks(ids.len());
        // What can never be sent is failed, not claimed: its event gone, its endpoint gone or disabled.
        let sql = format!(
            "UPDATE webhook_deliveries d SET d.state = 'failed', d.updated_at = ?, d.last_error = IF(EXISTS \
             (SELECT 1 FROM events e WHERE e.id = d.event_id), ?, ?) WHERE d.id IN ({list}) \
             AND (NOT EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id) OR NOT EXISTS \
             (SELECT 1 FROM webhook_endpoints w WHERE w.id = d.endpoint_id AND w.enabled = TRUE))"
        );
        let q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(STRANDED).bind(EVENT_GONE);
        bind_all!(q, &ids).execute(&mut *tx).await?;
        // The lease runs on the database's clock, from now: every process compares the same clock with it.
        let sql = format!(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, claim = claim + 1, \
             next_attempt_at = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + ?, updated_at = ? \
             WHERE state = 'pending' AND id IN ({list})"
        );
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(lease_ms).bind(now), &ids).execute(&mut *tx).await?;
        let sql = format!(
            "UPDATE webhook_attempts SET outcome = 'abandoned', finished_at = ?, error = ? \
             WHERE outcome = 'in_flight' AND delivery_id IN ({list})"
        );
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(ABANDONED), &ids).execute(&mut *tx).await?;
        let sql = format!(
            "INSERT INTO webhook_attempts (delivery_id, attempt, endpoint_id, event_id, tenant, outcome, started_at) \
             SELECT id, attempts, endpoint_id, event_id, tenant, 'in_flight', ? FROM webhook_deliveries \
             WHERE state = 'pending' AND id IN ({list})"
        );
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now), &ids).execute(&mut *tx).await?;
        let sql = format!(
            "SELECT d.*, w.url, w.secret, w.previous_secret, w.previous_until, e.type AS event_type, \
             e.data AS event_data, e.created_at AS event_created_at, e.traceparent FROM webhook_deliveries d \
             JOIN webhook_endpoints w ON w.id = d.endpoint_id JOIN events e ON e.id = d.event_id \
             WHERE d.state = 'pending' AND d.id IN ({list})"
        );
        let claimed = bind_all!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), &ids).fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    async fn give_back(&self, c: &Claimed, now: i64) -> Result<bool, sqlx::Error> {
        let d = &c.delivery;
        let mut tx = self.begin().await.map_err(engine)?;
        let moved = sqlx::query(
            "UPDATE webhook_deliveries SET next_attempt_at = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), \
             updated_at = ? WHERE id = ? AND claim = ? AND state = 'pending'",
        )
        .bind(now)
        .bind(&d.id)
        .bind(d.claim)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE webhook_attempts SET outcome = 'abandoned', finished_at = ?, error = ? \
             WHERE delivery_id = ? AND attempt = ? AND outcome = 'in_flight'",
        )
        .bind(now)
        .bind(UNSENT)
        .bind(&d.id)
        .bind(d.attempts)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(moved.rows_affected() == 1)
    }

    async fn finish(&self, c: &Claimed, r: &AttemptResult) -> Result<bool, sqlx::Error> {
        let d = &c.delivery;
        let mut tx = self.begin().await.map_err(engine)?;
        // Rows in the order every writer takes them (endpoint, delivery, attempt): no deadlock with a delete.
        if r.gone {
            sqlx::query(
                "UPDATE webhook_endpoints SET enabled = FALSE, disabled_reason = 'gone', updated_at = ? \
                 WHERE id = ? AND enabled = TRUE",
            )
            .bind(r.finished_at)
            .bind(&d.endpoint_id)
            .execute(&mut *tx)
            .await?;
        }
        let moved = sqlx::query(
            "UPDATE webhook_deliveries SET state = ?, \
             next_attempt_at = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + COALESCE(?, 0), last_status = ?, \
             last_error = ?, updated_at = ? WHERE id = ? AND claim = ? AND state = 'pending'",
        )
        .bind(delivery_state(r))
        .bind(r.retry_in)
        .bind(r.status_code)
        .bind(&r.error)
        .bind(r.finished_at)
        .bind(&d.id)
        .bind(d.claim)
        .execute(&mut *tx)
        .await?;
        // What happened is recorded whatever became of the claim: the attempt was made.
        sqlx::query(
            "UPDATE webhook_attempts SET outcome = ?, finished_at = ?, status_code = ?, latency_ms = ?, error = ?, \
             next_attempt_at = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + ? \
             WHERE delivery_id = ? AND attempt = ? AND outcome = 'in_flight'",
        )
        .bind(r.outcome)
        .bind(r.finished_at)
        .bind(r.status_code)
        .bind(r.latency_ms)
        .bind(&r.error)
        .bind(r.retry_in)
        .bind(&d.id)
        .bind(d.attempts)
        .execute(&mut *tx)
        .await?;
        if r.gone {
            fail_pending(&mut tx, &d.endpoint_id, GONE, r.finished_at).await?;
        }
        tx.commit().await?;
        Ok(moved.rows_affected() == 1)
    }

    async fn pending(&self) -> Result<(i64, Option<i64>), sqlx::Error> {
        sqlx::query_as("SELECT count(*), min(created_at) FROM webhook_deliveries WHERE state = 'pending'")
            .fetch_one(self.pool())
            .await
    }

    async fn undispatched(&self) -> Result<Option<i64>, sqlx::Error> {
        // Not numbered yet (the sequencer's turn), or numbered after the dispatcher's cursor: each through its
        // own index.
        sqlx::query_scalar(
            "SELECT min(created_at) FROM ((SELECT created_at FROM events WHERE seq IS NULL ORDER BY n LIMIT 1) \
             UNION ALL (SELECT created_at FROM events WHERE seq > (SELECT position FROM event_dispatch WHERE id = 1) \
             ORDER BY seq LIMIT 1)) AS waiting",
        )
        .fetch_one(self.pool())
        .await
    }

    async fn fail_stranded(&self, now: i64) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE webhook_deliveries d SET d.state = 'failed', d.last_error = ?, d.updated_at = ? \
             WHERE d.state = 'pending' AND NOT EXISTS (SELECT 1 FROM webhook_endpoints w WHERE w.id = d.endpoint_id \
             AND w.enabled = TRUE)",
        )
        .bind(STRANDED)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
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
        let ids: Vec<String> = doomed.iter().map(|(id, _, _)| id.clone()).collect();
        let list = marks(ids.len());
        let mut tx = self.begin().await.map_err(engine)?;
        // Locked first: a redelivery that locked an event for share has committed its delivery before this
        // goes on, and the checks below (later statements, READ COMMITTED) see it; one that comes after finds no
        // event.
        let sql = format!("SELECT id FROM events WHERE id IN ({list}) FOR UPDATE");
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), &ids).execute(&mut *tx).await?;
        let sql = format!(
            "DELETE a FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id \
             WHERE d.state <> 'pending' AND d.event_id IN ({list})"
        );
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), &ids).execute(&mut *tx).await?;
        let sql = format!("DELETE FROM webhook_deliveries WHERE state <> 'pending' AND event_id IN ({list})");
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), &ids).execute(&mut *tx).await?;
        // A redelivery asked for meanwhile keeps its event.
        let sql = format!(
            "DELETE FROM events WHERE id IN ({list}) AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d \
             WHERE d.event_id = events.id AND d.state = 'pending')"
        );
        let deleted = bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), &ids).execute(&mut *tx).await?.rows_affected();
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

/// Fails the pending deliveries of `endpoint_id` (deleted, disabled, gone) for `why`, in the caller's
/// transaction (after the endpoint's row, which it locked).
async fn fail_pending(conn: &mut MySqlConnection, endpoint_id: &str, why: &str, now: i64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE webhook_deliveries SET state = 'failed', last_error = ?, updated_at = ? \
         WHERE state = 'pending' AND endpoint_id = ?",
    )
    .bind(why)
    .bind(now)
    .bind(endpoint_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Inserts `d`, due at once by the database's clock, unless its id exists: whether it did.
async fn insert_delivery(conn: &mut MySqlConnection, d: &NewDelivery) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, tenant, state, attempts, claim, next_attempt_at, \
         schedule, created_at, updated_at) \
         VALUES (?, ?, ?, ?, 'pending', 0, 0, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), ?, ?, ?)",
    )
    .bind(&d.id)
    .bind(&d.event_id)
    .bind(&d.endpoint_id)
    .bind(&d.tenant)
    .bind(&d.schedule)
    .bind(d.created_at)
    .bind(d.created_at)
    .execute(&mut *conn)
    .await;
    inserted(done)
}
