//! The event queries Postgres and SQLite share: the same SQL text (`$n` parameters, `ON CONFLICT`,
//! `RETURNING`), written once as one implementation of [`EventStore`] over [`StandardEvents`]. What differs —
//! how the log is kept in commit order, how rows are locked, the database's clock, how the dispatcher runs
//! alone — each backend's file says.

use std::future::Future;

use onceflow_engine::{Conn, Store};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use super::{
    ABANDONED, DELETED, DISABLED, EVENT_GONE, EventBatch, EventStore, GONE, Holder, LogPage, LogRow, STRANDED, Scope,
    Sql, UNSENT, choose, delivery_state, engine, horizons, log_page, numbered, plan,
};
use crate::events::model::{
    Attempt, AttemptOutcome, AttemptResult, Claimed, Delivery, DeliveryState, Endpoint, EndpointChange, Event,
    EventType, NewDelivery, NewEvent, Position,
};

/// A store whose database runs the standard event SQL of this file (Postgres, SQLite).
pub(super) trait StandardEvents: Store {
    /// The SQL of an event's position in the log (`major`, as a `bigint`).
    const POSITION: &'static str;
    /// The log's order.
    const ORDER: &'static str;
    /// Appended to a claim's `SELECT`: lock the rows, skipping those another transaction holds (nothing where
    /// one process writes).
    const SKIP_LOCKED: &'static str;
    /// Appended to a `SELECT` of rows that must not change until the transaction ends (nothing where one
    /// transaction writes at a time).
    const FOR_SHARE: &'static str;
    /// Appended to a `SELECT` of rows about to be deleted.
    const FOR_UPDATE: &'static str;
    /// The database's clock, in ms since the epoch: what every process compares a delivery's due time with.
    const NOW: &'static str;
    /// Taken first in the dispatcher's transaction: `true` when this process may dispatch now.
    const DISPATCH_LOCK: Option<&'static str>;
    /// The dispatcher's cursor: `(major, event id)`.
    const DISPATCH_CURSOR: &'static str;
    /// Moves the dispatcher's cursor to `($1` as text, `$2)`.
    const MOVE_DISPATCH: &'static str;
    /// The creation time of the first event after the dispatcher's cursor, shown or not.
    const UNDISPATCHED: &'static str;

    /// The condition "after the position `($major` as text, `$id)`, and no later commit can precede it".
    fn after(major: usize, id: usize) -> String;

    /// The log's query (rows of [`LogRow`]): up to `$3` events after the position `($1` as text, `$2)` of the
    /// tenant `$4` (when `scoped`) of the `types` types (the parameters after), then the newest event of the
    /// tenant shown (any type, `tail` 1) — in one statement, so both see the same log.
    fn log(scoped: bool, types: usize) -> String;

    /// The rows a statement changed.
    fn rows(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// The session holding the log back, where it can be held.
    fn held_by(&self) -> impl Future<Output = Result<Option<Holder>, sqlx::Error>> + Send {
        async { Ok(None) }
    }
}

/// The columns of an event as [`Event`] reads them.
fn event_columns<S: StandardEvents>() -> String {
    format!("id, tenant, type, data, created_at, traceparent, {} AS position", S::POSITION)
}

/// Binds each of `values` to `query`, in order.
macro_rules! bind_all {
    ($query:expr, $values:expr) => {{
        let mut q = $query;
        for v in $values {
            q = q.bind(v.clone());
        }
        q
    }};
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
    for<'q> Option<bool>: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> EventType: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> DeliveryState: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> AttemptOutcome: Encode<'q, S::Db> + Type<S::Db>,
    for<'r> Event: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> LogRow: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> Endpoint: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> Delivery: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> Attempt: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> Claimed: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64, String): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64, Option<i64>): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (String, String): FromRow<'r, <S::Db as Database>::Row>,
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
    ) -> Result<LogPage, sqlx::Error> {
        let sql = S::log(scope.is_some(), types.len());
        let mut q = sqlx::query_as::<_, LogRow>(sqlx::AssertSqlSafe(sql))
            .bind(after.major.to_string())
            .bind(after.id.clone())
            .bind(limit);
        if let Some(tenant) = scope {
            q = q.bind(tenant.to_owned());
        }
        for t in types {
            q = q.bind(*t);
        }
        Ok(log_page(q.fetch_all(self.pool()).await?, limit))
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

    async fn update_endpoint(
        &self,
        id: &str,
        change: &EndpointChange,
        now: i64,
    ) -> Result<Option<Endpoint>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let endpoint: Option<Endpoint> = sqlx::query_as(
            "UPDATE webhook_endpoints SET url = COALESCE($2, url), \
             events = CASE WHEN $3 THEN $4 ELSE events END, enabled = COALESCE($5, enabled), \
             disabled_reason = CASE WHEN $5 IS NULL THEN disabled_reason WHEN $5 THEN NULL ELSE 'disabled' END, \
             updated_at = $6 WHERE id = $1 RETURNING *",
        )
        .bind(id.to_owned())
        .bind(change.url.clone())
        .bind(change.events.is_some())
        .bind(change.events.clone().flatten())
        .bind(change.enabled)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        if endpoint.is_some() && change.enabled == Some(false) {
            fail_pending::<S>(&mut tx, id, DISABLED, now).await?;
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
        // One statement: the row's own secret becomes the previous one, whatever else changed it meanwhile.
        sqlx::query_as(
            "UPDATE webhook_endpoints SET previous_secret = secret, secret = $2, previous_until = $3, \
             updated_at = $4 WHERE id = $1 RETURNING *",
        )
        .bind(id.to_owned())
        .bind(secret.to_owned())
        .bind(until)
        .bind(now)
        .fetch_optional(self.write_pool())
        .await
    }

    async fn delete_endpoint(&self, id: &str, now: i64) -> Result<bool, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let done =
            sqlx::query("DELETE FROM webhook_endpoints WHERE id = $1").bind(id.to_owned()).execute(&mut *tx).await?;
        fail_pending::<S>(&mut tx, id, DELETED, now).await?;
        tx.commit().await?;
        Ok(S::rows(&done) == 1)
    }

    async fn insert_deliveries(&self, deliveries: &[NewDelivery]) -> Result<Vec<bool>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let mut made = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            // Locked for share until the insert commits: retention cannot delete the event, nor a tenant delete
            // or disable the endpoint, in between; if either did first, its row is not found here.
            let event: Option<(String,)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT id FROM events WHERE id = $1{}", S::FOR_SHARE)))
                    .bind(d.event_id.clone())
                    .fetch_optional(&mut *tx)
                    .await?;
            let endpoint: Option<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT id FROM webhook_endpoints WHERE id = $1 AND tenant = $2 AND enabled = TRUE{}",
                S::FOR_SHARE
            )))
            .bind(d.endpoint_id.clone())
            .bind(d.tenant.clone())
            .fetch_optional(&mut *tx)
            .await?;
            made.push(event.is_some() && endpoint.is_some() && insert_delivery::<S>(&mut tx, d).await?);
        }
        tx.commit().await?;
        Ok(made)
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
        match before {
            Some((at, delivery, attempt)) => {
                sqlx::query_as(
                    "SELECT * FROM webhook_attempts WHERE endpoint_id = $1 \
                     AND (started_at, delivery_id, attempt) < ($2, $3, $4) \
                     ORDER BY started_at DESC, delivery_id DESC, attempt DESC LIMIT $5",
                )
                .bind(endpoint_id.to_owned())
                .bind(*at)
                .bind(delivery.clone())
                .bind(*attempt)
                .bind(limit)
                .fetch_all(self.pool())
                .await
            }
            None => {
                sqlx::query_as(
                    "SELECT * FROM webhook_attempts WHERE endpoint_id = $1 \
                     ORDER BY started_at DESC, delivery_id DESC, attempt DESC LIMIT $2",
                )
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
        if self.events_after(None, &cursor, &[], 1).await?.events.is_empty() {
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
        let mut tenants: Vec<String> = events.iter().map(|e| e.tenant.clone()).collect();
        tenants.sort();
        tenants.dedup();
        // Locked for share until the deliveries commit: an endpoint deleted or disabled meanwhile waits, then
        // fails them; one deleted or disabled before is not read.
        let sql = format!(
            "SELECT * FROM webhook_endpoints WHERE enabled = TRUE AND tenant IN ({}){}",
            numbered(1, tenants.len()),
            S::FOR_SHARE
        );
        let endpoints: Vec<Endpoint> =
            bind_all!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), &tenants).fetch_all(&mut *tx).await?;
        for d in plan(&events, &endpoints, now, schedule) {
            insert_delivery::<S>(&mut tx, &d).await?;
        }
        sqlx::query(S::MOVE_DISPATCH).bind(last.major.to_string()).bind(last.id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(events.len() as u64)
    }

    async fn due_endpoints(&self) -> Result<Vec<(String, String)>, sqlx::Error> {
        let sql = format!(
            "SELECT w.id, w.tenant FROM webhook_endpoints w WHERE w.enabled = TRUE AND EXISTS (SELECT 1 \
             FROM webhook_deliveries d WHERE d.endpoint_id = w.id AND d.state = 'pending' AND d.next_attempt_at <= {})",
            S::NOW
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(self.pool()).await
    }

    async fn claim(&self, endpoint_id: &str, limit: i64, now: i64, lease_ms: i64) -> Result<Vec<Claimed>, sqlx::Error> {
        let mut tx = self.begin().await.map_err(engine)?;
        let sql = format!(
            "SELECT id FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at <= {} \
             ORDER BY next_attempt_at LIMIT $2{}",
            S::NOW,
            S::SKIP_LOCKED
        );
        let ids: Vec<String> = sqlx::query_as::<_, (String,)>(sqlx::AssertSqlSafe(sql))
            .bind(endpoint_id.to_owned())
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|(id,)| id)
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // What can never be sent is failed, not claimed: its event gone, its endpoint gone or disabled.
        let sql = format!(
            "UPDATE webhook_deliveries SET state = 'failed', updated_at = $1, last_error = CASE WHEN EXISTS \
             (SELECT 1 FROM events e WHERE e.id = webhook_deliveries.event_id) THEN $2 ELSE $3 END \
             WHERE id IN ({}) AND (NOT EXISTS (SELECT 1 FROM events e WHERE e.id = webhook_deliveries.event_id) \
             OR NOT EXISTS (SELECT 1 FROM webhook_endpoints w WHERE w.id = webhook_deliveries.endpoint_id \
             AND w.enabled = TRUE))",
            numbered(4, ids.len())
        );
        let q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(STRANDED.to_owned()).bind(EVENT_GONE.to_owned());
        bind_all!(q, &ids).execute(&mut *tx).await?;
        // The lease runs on the database's clock, from now: every process compares the same clock with it.
        let sql = format!(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, claim = claim + 1, next_attempt_at = {} + $1, \
             updated_at = $2 WHERE state = 'pending' AND id IN ({})",
            S::NOW,
            numbered(3, ids.len())
        );
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(lease_ms).bind(now), &ids).execute(&mut *tx).await?;
        let sql = format!(
            "UPDATE webhook_attempts SET outcome = 'abandoned', finished_at = $1, error = $2 \
             WHERE outcome = 'in_flight' AND delivery_id IN ({})",
            numbered(3, ids.len())
        );
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(ABANDONED.to_owned()), &ids)
            .execute(&mut *tx)
            .await?;
        let sql = format!(
            "INSERT INTO webhook_attempts (delivery_id, attempt, endpoint_id, event_id, tenant, outcome, started_at) \
             SELECT id, attempts, endpoint_id, event_id, tenant, 'in_flight', $1 FROM webhook_deliveries \
             WHERE state = 'pending' AND id IN ({})",
            numbered(2, ids.len())
        );
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now), &ids).execute(&mut *tx).await?;
        let sql = format!(
            "SELECT d.*, w.url, w.secret, w.previous_secret, w.previous_until, e.type AS event_type, \
             e.data AS event_data, e.created_at AS event_created_at, e.traceparent FROM webhook_deliveries d \
             JOIN webhook_endpoints w ON w.id = d.endpoint_id JOIN events e ON e.id = d.event_id \
             WHERE d.state = 'pending' AND d.id IN ({})",
            numbered(1, ids.len())
        );
        let claimed = bind_all!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), &ids).fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    async fn give_back(&self, c: &Claimed, now: i64) -> Result<bool, sqlx::Error> {
        let d = &c.delivery;
        let mut tx = self.begin().await.map_err(engine)?;
        let sql = format!(
            "UPDATE webhook_deliveries SET next_attempt_at = {}, updated_at = $3 \
             WHERE id = $1 AND claim = $2 AND state = 'pending'",
            S::NOW
        );
        let moved =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(d.id.clone()).bind(d.claim).bind(now).execute(&mut *tx).await?;
        sqlx::query(
            "UPDATE webhook_attempts SET outcome = 'abandoned', finished_at = $3, error = $4 \
             WHERE delivery_id = $1 AND attempt = $2 AND outcome = 'in_flight'",
        )
        .bind(d.id.clone())
        .bind(d.attempts)
        .bind(now)
        .bind(UNSENT.to_owned())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(S::rows(&moved) == 1)
    }

    async fn finish(&self, c: &Claimed, r: &AttemptResult) -> Result<bool, sqlx::Error> {
        let d = &c.delivery;
        let mut tx = self.begin().await.map_err(engine)?;
        // Rows in the order every writer takes them (endpoint, delivery, attempt): no deadlock with a delete.
        if r.gone {
            sqlx::query(
                "UPDATE webhook_endpoints SET enabled = FALSE, disabled_reason = 'gone', updated_at = $2 \
                 WHERE id = $1 AND enabled = TRUE",
            )
            .bind(d.endpoint_id.clone())
            .bind(r.finished_at)
            .execute(&mut *tx)
            .await?;
        }
        let sql = format!(
            "UPDATE webhook_deliveries SET state = $3, next_attempt_at = {} + COALESCE($4, 0), last_status = $5, \
             last_error = $6, updated_at = $7 WHERE id = $1 AND claim = $2 AND state = 'pending'",
            S::NOW
        );
        let moved = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(d.id.clone())
            .bind(d.claim)
            .bind(delivery_state(r))
            .bind(r.retry_in)
            .bind(r.status_code)
            .bind(r.error.clone())
            .bind(r.finished_at)
            .execute(&mut *tx)
            .await?;
        // What happened is recorded whatever became of the claim: the attempt was made.
        let sql = format!(
            "UPDATE webhook_attempts SET outcome = $3, finished_at = $4, status_code = $5, latency_ms = $6, \
             error = $7, next_attempt_at = {} + $8 WHERE delivery_id = $1 AND attempt = $2 AND outcome = 'in_flight'",
            S::NOW
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(d.id.clone())
            .bind(d.attempts)
            .bind(r.outcome)
            .bind(r.finished_at)
            .bind(r.status_code)
            .bind(r.latency_ms)
            .bind(r.error.clone())
            .bind(r.retry_in)
            .execute(&mut *tx)
            .await?;
        if r.gone {
            fail_pending::<S>(&mut tx, &d.endpoint_id, GONE, r.finished_at).await?;
        }
        tx.commit().await?;
        Ok(S::rows(&moved) == 1)
    }

    async fn pending(&self) -> Result<(i64, Option<i64>), sqlx::Error> {
        sqlx::query_as("SELECT count(*), min(created_at) FROM webhook_deliveries WHERE state = 'pending'")
            .fetch_one(self.pool())
            .await
    }

    async fn undispatched(&self) -> Result<Option<i64>, sqlx::Error> {
        let first: Option<(i64,)> = sqlx::query_as(S::UNDISPATCHED).fetch_optional(self.pool()).await?;
        Ok(first.map(|(created_at,)| created_at))
    }

    async fn log_held_by(&self) -> Result<Option<Holder>, sqlx::Error> {
        self.held_by().await
    }

    async fn fail_stranded(&self, now: i64) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE webhook_deliveries SET state = 'failed', last_error = $1, updated_at = $2 WHERE state = 'pending' \
             AND NOT EXISTS (SELECT 1 FROM webhook_endpoints w WHERE w.id = webhook_deliveries.endpoint_id \
             AND w.enabled = TRUE)",
        )
        .bind(STRANDED.to_owned())
        .bind(now)
        .execute(self.write_pool())
        .await?;
        Ok(S::rows(&done))
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
        let ids: Vec<String> = doomed.iter().map(|(id, _, _)| id.clone()).collect();
        let list = numbered(1, ids.len());
        let mut tx = self.begin().await.map_err(engine)?;
        // Locked first: a redelivery that locked an event for share has committed its delivery before this
        // goes on, and the checks below (later statements) see it; one that comes after finds no event.
        let sql = format!("SELECT id FROM events WHERE id IN ({list}){}", S::FOR_UPDATE);
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), &ids).execute(&mut *tx).await?;
        let sql = format!(
            "DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM webhook_deliveries \
             WHERE state <> 'pending' AND event_id IN ({list}))"
        );
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), &ids).execute(&mut *tx).await?;
        let sql = format!("DELETE FROM webhook_deliveries WHERE state <> 'pending' AND event_id IN ({list})");
        bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), &ids).execute(&mut *tx).await?;
        // A redelivery asked for meanwhile keeps its event.
        let sql = format!(
            "DELETE FROM events WHERE id IN ({list}) AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d \
             WHERE d.event_id = events.id AND d.state = 'pending')"
        );
        let deleted = S::rows(&bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), &ids).execute(&mut *tx).await?);
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

/// Fails the pending deliveries of `endpoint_id` (deleted, disabled, gone) for `why`, in the caller's
/// transaction (after the endpoint's row, which it locked).
async fn fail_pending<S>(conn: &mut Conn<S>, endpoint_id: &str, why: &str, now: i64) -> Result<(), sqlx::Error>
where
    S: StandardEvents,
    for<'c> &'c mut <S::Db as Database>::Connection: Executor<'c, Database = S::Db>,
    <S::Db as Database>::Arguments: IntoArguments<S::Db>,
    for<'q> String: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> i64: Encode<'q, S::Db> + Type<S::Db>,
{
    sqlx::query(
        "UPDATE webhook_deliveries SET state = 'failed', last_error = $2, updated_at = $3 \
         WHERE endpoint_id = $1 AND state = 'pending'",
    )
    .bind(endpoint_id.to_owned())
    .bind(why.to_owned())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Inserts `d`, due at once by the database's clock, unless its id exists: whether it did.
async fn insert_delivery<S>(conn: &mut Conn<S>, d: &NewDelivery) -> Result<bool, sqlx::Error>
where
    S: StandardEvents,
    for<'c> &'c mut <S::Db as Database>::Connection: Executor<'c, Database = S::Db>,
    <S::Db as Database>::Arguments: IntoArguments<S::Db>,
    for<'q> String: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> i64: Encode<'q, S::Db> + Type<S::Db>,
{
    let sql = format!(
        "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, tenant, state, attempts, claim, \
         next_attempt_at, schedule, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, 'pending', 0, 0, {}, $5, $6, $6) ON CONFLICT (id) DO NOTHING",
        S::NOW
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(d.id.clone())
        .bind(d.event_id.clone())
        .bind(d.endpoint_id.clone())
        .bind(d.tenant.clone())
        .bind(d.schedule.clone())
        .bind(d.created_at)
        .execute(&mut *conn)
        .await?;
    Ok(S::rows(&done) == 1)
}
