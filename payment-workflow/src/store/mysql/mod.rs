//! The payment tables on MySQL / MariaDB: `?` parameters, bound in the order they appear, and a duplicate key
//! read as "exists" (MySQL rolls back only the failed statement, the step's transaction goes on). The saga's
//! phases run as closure steps in one transaction (`steps.rs`); here, the queries outside steps.

use onceflow_engine::{Conn, Failure, Interrupt, MySqlStore, StepSpec, Store, WorkflowContext};

use super::{PassLock, PaymentCursor, PaymentStore, Reserve, ReserveSteps, Sql, TokenCheck, TokenKind};
use crate::model::PaymentInput;
use crate::model::{
    Order, OrderNo, OrderStatus, PaymentRecord, PaymentStatus, RequestNo, StoredResponse, Token, TokenRecord,
};

mod refunds;
mod steps;

/// `Ok(false)` for a duplicate key, `Ok(true)` for an insert.
fn inserted(result: Result<sqlx::mysql::MySqlQueryResult, sqlx::Error>) -> Result<bool, sqlx::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(false),
        Err(e) => Err(e),
    }
}

/// The payment tables' embedded MySQL migrations (the engine migrates its own tables, with versions of
/// their own in the same history).
pub static MIGRATOR: sqlx::migrate::Migrator =
    sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!("migrations/mysql") };

/// The retention pass's lock. `GET_LOCK` names are server-wide, so the name carries the database's; a digest
/// keeps it under the 64 characters a name may have.
const PASS_LOCK: &str = "SELECT GET_LOCK(CONCAT('onceflow.gc.', MD5(DATABASE())), 0)";
const PASS_UNLOCK: &str = "SELECT RELEASE_LOCK(CONCAT('onceflow.gc.', MD5(DATABASE())))";

/// [`PaymentStore::delete_tokens`] and [`PaymentStore::count_tokens`] for `kind`: one bounded range of
/// `tokens_expiry (state, expires_at)` or `tokens_ended (state, updated_at)` (migration 0010). A single-table
/// `DELETE … LIMIT` locks only the rows it deletes (`READ COMMITTED`), each re-read as last committed.
fn token_sql(kind: TokenKind) -> (&'static str, &'static str) {
    match kind {
        TokenKind::Unused => (
            "DELETE FROM idempotency_tokens WHERE state = 'issued' AND expires_at <= ? ORDER BY expires_at LIMIT ?",
            "SELECT COUNT(*) FROM idempotency_tokens WHERE state = 'issued' AND expires_at <= ?",
        ),
        TokenKind::Used => (
            "DELETE FROM idempotency_tokens WHERE state = 'completed' AND updated_at <= ? ORDER BY updated_at LIMIT ?",
            "SELECT COUNT(*) FROM idempotency_tokens WHERE state = 'completed' AND updated_at <= ?",
        ),
    }
}

impl PaymentStore for MySqlStore {
    async fn migrate_payments(&self) -> Result<(), onceflow_engine::Error> {
        self.migrate().await?;
        self.run_migrations(&MIGRATOR).await
    }

    async fn reserve(
        ctx: &mut WorkflowContext<Self>,
        input: &PaymentInput,
        now: i64,
        steps: ReserveSteps,
        refused: Failure,
    ) -> Result<Option<Reserve>, Interrupt> {
        steps::reserve(ctx, input, now, steps, refused).await
    }

    async fn confirm(
        ctx: &mut WorkflowContext<Self>,
        input: &PaymentInput,
        now: i64,
        spec: StepSpec,
        charge_id: String,
        response: StoredResponse,
        not_paying: Failure,
    ) -> Result<StoredResponse, Interrupt> {
        steps::confirm(ctx, input, now, spec, charge_id, response, not_paying).await
    }

    fn move_order<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        order_no: OrderNo,
        request_no: RequestNo,
        to: OrderStatus,
        now: i64,
    ) -> Sql<'c, bool> {
        Box::pin(steps::move_order(conn, tenant, order_no, request_no, to, now))
    }

    fn fail_payment<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        request_no: RequestNo,
        token: Token,
        status: PaymentStatus,
        code: Option<String>,
        now: i64,
    ) -> Sql<'c, bool> {
        let ended = if status == PaymentStatus::Declined {
            steps::Ended { decline_code: code, ..steps::Ended::default() }
        } else {
            steps::Ended { failure_code: code, ..steps::Ended::default() }
        };
        Box::pin(steps::set_payment_status(conn, tenant, request_no, token, status, ended, now))
    }

    fn complete_token<'c>(
        conn: &'c mut Conn<Self>,
        token: Token,
        response_status: i32,
        body: String,
        now: i64,
    ) -> Sql<'c, ()> {
        Box::pin(steps::complete_token(conn, token, response_status, body, now))
    }

    async fn insert_order(&self, o: &Order) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO orders (tenant, order_no, amount, currency, status, version, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&o.tenant)
        .bind(&o.order_no)
        .bind(o.amount)
        .bind(&o.currency)
        .bind(o.status)
        .bind(o.version)
        .bind(o.created_at)
        .bind(o.updated_at)
        .execute(self.write_pool())
        .await;
        inserted(done)
    }

    async fn order(&self, tenant: &str, order_no: &OrderNo) -> Result<Option<Order>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM orders WHERE tenant = ? AND order_no = ?")
            .bind(tenant)
            .bind(order_no)
            .fetch_optional(self.pool())
            .await
    }

    async fn insert_token(&self, t: &TokenRecord) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO idempotency_tokens (token, tenant, state, fingerprint, route, response_status, \
             response_body, created_at, expires_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&t.token)
        .bind(&t.tenant)
        .bind(t.state)
        .bind(&t.fingerprint)
        .bind(&t.route)
        .bind(t.response_status)
        .bind(&t.response_body)
        .bind(t.created_at)
        .bind(t.expires_at)
        .bind(t.updated_at)
        .execute(self.write_pool())
        .await?;
        Ok(())
    }

    async fn ensure_token(&self, t: &TokenRecord) -> Result<(), sqlx::Error> {
        // One statement: the row is inserted, or revived under its lock, or left alone. (An insert whose
        // duplicate was then revived by an update of its own raced a retention pass that deleted the expired
        // token in between: the update found nothing, and the command was refused as an unknown token.)
        // `updated_at` is assigned first: MySQL evaluates the assignments in order, and the condition reads
        // `expires_at`.
        sqlx::query(
            "INSERT INTO idempotency_tokens (token, tenant, state, fingerprint, route, response_status, \
             response_body, created_at, expires_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE \
               updated_at = IF(state = 'issued' AND expires_at <= VALUES(created_at), VALUES(updated_at), updated_at), \
               expires_at = IF(state = 'issued' AND expires_at <= VALUES(created_at), VALUES(expires_at), expires_at)",
        )
        .bind(&t.token)
        .bind(&t.tenant)
        .bind(t.state)
        .bind(&t.fingerprint)
        .bind(&t.route)
        .bind(t.response_status)
        .bind(&t.response_body)
        .bind(t.created_at)
        .bind(t.expires_at)
        .bind(t.updated_at)
        .execute(self.write_pool())
        .await?;
        Ok(())
    }

    async fn settle_unused_token(
        &self,
        token: &Token,
        request_no: &RequestNo,
        fingerprint: &str,
        route: &str,
        response: &StoredResponse,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE idempotency_tokens SET state = 'completed', fingerprint = ?, route = ?, response_status = ?, \
             response_body = ?, updated_at = ? WHERE token = ? AND state = 'issued' \
             AND fingerprint IS NULL AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.tenant = idempotency_tokens.tenant \
             AND p.request_no = ?)",
        )
        .bind(fingerprint)
        .bind(route)
        .bind(i32::from(response.status))
        .bind(&response.body)
        .bind(now)
        .bind(token)
        .bind(request_no)
        .execute(self.write_pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn mark_number_taken(&self, token: &Token) -> Result<bool, sqlx::Error> {
        let done = sqlx::query("UPDATE idempotency_tokens SET fingerprint = ? WHERE token = ? AND state = 'issued'")
            .bind(super::NUMBER_TAKEN)
            .bind(token)
            .execute(self.write_pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn token_and_order(
        &self,
        token: &Token,
        tenant: &str,
        order_no: &OrderNo,
    ) -> Result<Option<(TokenRecord, bool)>, sqlx::Error> {
        let found: Option<TokenCheck> = sqlx::query_as(
            "SELECT t.*, EXISTS (SELECT 1 FROM orders o WHERE o.tenant = ? AND o.order_no = ?) AS order_exists \
             FROM idempotency_tokens t WHERE t.token = ?",
        )
        .bind(tenant)
        .bind(order_no)
        .bind(token)
        .fetch_optional(self.pool())
        .await?;
        Ok(found.map(|f| (f.token, f.order_exists)))
    }

    async fn payment(&self, tenant: &str, request_no: &RequestNo) -> Result<Option<PaymentRecord>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM payments WHERE tenant = ? AND request_no = ?")
            .bind(tenant)
            .bind(request_no)
            .fetch_optional(self.pool())
            .await
    }

    async fn payments_by_charge(
        &self,
        tenant: Option<&str>,
        charge_id: &str,
        limit: i64,
    ) -> Result<Vec<PaymentRecord>, sqlx::Error> {
        sqlx::query_as(
            "SELECT * FROM payments WHERE charge_id = ? AND (? IS NULL OR tenant = ?) \
             ORDER BY created_at DESC, request_no DESC LIMIT ?",
        )
        .bind(charge_id)
        .bind(tenant)
        .bind(tenant)
        .bind(limit)
        .fetch_all(self.pool())
        .await
    }

    async fn payments_of_order(&self, tenant: &str, order_no: &OrderNo) -> Result<Vec<PaymentRecord>, sqlx::Error> {
        sqlx::query_as(
            "SELECT * FROM payments WHERE tenant = ? AND order_no = ? ORDER BY created_at DESC, request_no DESC",
        )
        .bind(tenant)
        .bind(order_no)
        .fetch_all(self.pool())
        .await
    }

    async fn payments_of_order_page(
        &self,
        tenant: &str,
        order_no: &OrderNo,
        after: Option<&PaymentCursor>,
        limit: i64,
    ) -> Result<Vec<PaymentRecord>, sqlx::Error> {
        let Some(after) = after else {
            return sqlx::query_as(
                "SELECT * FROM payments WHERE tenant = ? AND order_no = ? \
                 ORDER BY created_at DESC, request_no DESC LIMIT ?",
            )
            .bind(tenant)
            .bind(order_no)
            .bind(limit)
            .fetch_all(self.pool())
            .await;
        };
        // `created_at <= ?` bounds the index range (MySQL does not range-scan a row comparison); the rest only
        // sorts out the cursor's own millisecond.
        sqlx::query_as(
            "SELECT * FROM payments WHERE tenant = ? AND order_no = ? \
             AND created_at <= ? AND (created_at < ? OR request_no < ?) \
             ORDER BY created_at DESC, request_no DESC LIMIT ?",
        )
        .bind(tenant)
        .bind(order_no)
        .bind(after.created_at)
        .bind(after.created_at)
        .bind(&after.request_no)
        .bind(limit)
        .fetch_all(self.pool())
        .await
    }

    async fn unresolved(&self) -> Result<(i64, Option<i64>), sqlx::Error> {
        sqlx::query_as("SELECT count(*), min(created_at) FROM payments WHERE status = 'processing'")
            .fetch_one(self.pool())
            .await
    }

    async fn unresolved_before(
        &self,
        tenant: Option<&str>,
        created_before: i64,
        limit: i64,
    ) -> Result<Vec<(String, RequestNo, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT tenant, request_no, created_at FROM payments \
             WHERE status = 'processing' AND created_at <= ? AND (? IS NULL OR tenant = ?) \
             ORDER BY created_at LIMIT ?",
        )
        .bind(created_before)
        .bind(tenant)
        .bind(tenant)
        .bind(limit)
        .fetch_all(self.pool())
        .await
    }

    async fn delete_tokens(&self, kind: TokenKind, by: i64, limit: i64) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(token_sql(kind).0).bind(by).bind(limit).execute(self.pool()).await?;
        Ok(done.rows_affected())
    }

    async fn count_tokens(&self, kind: TokenKind, by: i64) -> Result<u64, sqlx::Error> {
        let count: i64 = sqlx::query_scalar(token_sql(kind).1).bind(by).fetch_one(self.pool()).await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// `GET_LOCK(name, 0)` on a connection of its own, held for the pass.
    async fn lock_pass(&self) -> Result<Option<PassLock>, sqlx::Error> {
        let mut conn = self.pool().acquire().await?;
        // Closed, not pooled, however the pass ends: even if this future is dropped between the lock and the
        // [`PassLock`] that would release it.
        conn.close_on_drop();
        let locked: Option<i64> = sqlx::query_scalar(PASS_LOCK).fetch_one(&mut *conn).await?;
        Ok((locked == Some(1)).then(|| PassLock::mysql(conn, PASS_UNLOCK)))
    }

    async fn all_orders(&self) -> Result<Vec<Order>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM orders ORDER BY tenant, order_no").fetch_all(self.pool()).await
    }

    async fn all_payments(&self) -> Result<Vec<PaymentRecord>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM payments ORDER BY tenant, request_no").fetch_all(self.pool()).await
    }

    fn succeed_payment<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        request_no: RequestNo,
        token: Token,
        charge_id: String,
        now: i64,
    ) -> Sql<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE payments SET status = 'succeeded', charge_id = ?, updated_at = ? \
                 WHERE tenant = ? AND request_no = ? AND token = ? AND status = 'processing'",
            )
            .bind(charge_id)
            .bind(now)
            .bind(tenant)
            .bind(request_no)
            .bind(token)
            .execute(conn)
            .await?;
            Ok(done.rows_affected() == 1)
        })
    }
}
