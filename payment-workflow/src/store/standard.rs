//! The payment queries Postgres and SQLite share: the same SQL text (`$n` parameters, `ON CONFLICT`), written
//! once for both as one implementation of [`PaymentStore`] over [`StandardSql`]; what differs — the dialect of
//! their statement phases, how a query result counts rows, their migrations — each backend's file says.

use std::future::Future;

use onceflow_engine::{Conn, Failure, Interrupt, StepSpec, Store, WorkflowContext};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use super::statement::{self, PhaseDialect};
use super::{
    NUMBER_TAKEN, PassLock, PaymentCursor, PaymentStore, Reserve, ReserveSteps, Sql, TokenCheck, TokenKind,
    engine_error,
};
use crate::model::PaymentInput;
use crate::model::{
    Currency, Order, OrderNo, OrderStatus, PaymentRecord, PaymentStatus, RequestNo, StoredResponse, Token, TokenRecord,
    TokenState,
};

/// A store whose database runs the standard payment SQL of this file (Postgres, SQLite).
pub trait StandardSql: Store + super::ChannelWordStore {
    /// The dialect of its statement phases.
    const DIALECT: PhaseDialect;

    /// The rows a statement changed (or, on MySQL's terms, matched).
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// Applies the payment tables' migrations (this crate's, for this backend).
    fn migrate_own(&self) -> impl Future<Output = Result<(), onceflow_engine::Error>> + Send;

    /// Takes the retention pass's lock (see [`PaymentStore::lock_pass`]).
    fn lock_pass(&self) -> impl Future<Output = Result<Option<PassLock>, sqlx::Error>> + Send;
}

/// The SQL of [`PaymentStore::delete_tokens`] and [`PaymentStore::count_tokens`] for a kind of token: those in
/// `$state` whose `$column` (the time their retention counts from: the expiry while unused, the last change, the
/// payment's end, once used) is `$1` or earlier. A batch takes them in the order of the partial index on
/// `$column` for `$state` (`tokens_unused`, `tokens_used`: migrations 0010, 0013), oldest first, so it is one
/// bounded range of it (without the order, Postgres may prefer a heap scan that stops at the limit, over dead
/// rows). The outer `DELETE` re-checks the condition on each row the batch chose, so that a row changed since the
/// subquery read it (an expired token revived by `ensure_token`, one claimed) is left alone; it is written so
/// that no index serves it (`|| ''`, `+ 0`): the rows are found by their primary key, not by a second scan of the
/// whole due range (SQLite without statistics would choose that).
macro_rules! token_sql {
    ($state:literal, $column:literal) => {
        (
            concat!(
                "DELETE FROM idempotency_tokens WHERE token IN (SELECT token FROM idempotency_tokens WHERE state = '",
                $state,
                "' AND ",
                $column,
                " <= $1 ORDER BY ",
                $column,
                " LIMIT $2) AND state || '' = '",
                $state,
                "' AND ",
                $column,
                " + 0 <= $1"
            ),
            concat!("SELECT count(*) FROM idempotency_tokens WHERE state = '", $state, "' AND ", $column, " <= $1"),
        )
    };
}

/// The SQL of [`PaymentStore::delete_tokens`] and [`PaymentStore::count_tokens`] for `kind`.
fn token_sql(kind: TokenKind) -> (&'static str, &'static str) {
    match kind {
        TokenKind::Unused => token_sql!("issued", "expires_at"),
        TokenKind::Used => token_sql!("completed", "updated_at"),
    }
}

impl<S> PaymentStore for S
where
    S: StandardSql + crate::events::EventStore + super::RefundStore,
    for<'c> &'c mut <S::Db as Database>::Connection: Executor<'c, Database = S::Db>,
    <S::Db as Database>::Arguments: IntoArguments<S::Db>,
    for<'q> String: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> Option<String>: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> i64: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> i32: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> Option<i32>: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> OrderNo: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> RequestNo: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> Token: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> Currency: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> OrderStatus: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> PaymentStatus: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> TokenState: Encode<'q, S::Db> + Type<S::Db>,
    for<'r> Order: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> PaymentRecord: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> TokenCheck: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64, Option<i64>): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (String, RequestNo, i64): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> i64: sqlx::Decode<'r, S::Db>,
{
    async fn migrate_payments(&self) -> Result<(), onceflow_engine::Error> {
        self.migrate().await?;
        self.migrate_own().await
    }

    async fn reserve(
        ctx: &mut WorkflowContext<Self>,
        input: &PaymentInput,
        now: i64,
        steps: ReserveSteps,
        refused: Failure,
    ) -> Result<Option<Reserve>, Interrupt> {
        statement::run_reserve(ctx, S::DIALECT, input, now, steps, refused).await
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
        statement::run_confirm(ctx, S::DIALECT, input, now, spec, &charge_id, response, not_paying).await
    }

    fn move_order<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        order_no: OrderNo,
        request_no: RequestNo,
        to: OrderStatus,
        now: i64,
    ) -> Sql<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE orders SET status = $4, version = version + 1, updated_at = $5 \
                 WHERE tenant = $1 AND order_no = $2 AND status = 'paying' AND reserved_by = $3",
            )
            .bind(tenant)
            .bind(order_no)
            .bind(request_no)
            .bind(to)
            .bind(now)
            .execute(conn)
            .await?;
            Ok(S::rows_affected(&done) == 1)
        })
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
        let (decline_code, failure_code) = if status == PaymentStatus::Declined { (code, None) } else { (None, code) };
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE payments SET status = $3, decline_code = COALESCE($4, decline_code), \
                 failure_code = COALESCE($7, failure_code), updated_at = $5 \
                 WHERE tenant = $1 AND request_no = $2 AND token = $6 AND status = 'processing'",
            )
            .bind(tenant)
            .bind(request_no)
            .bind(status)
            .bind(decline_code)
            .bind(now)
            .bind(token)
            .bind(failure_code)
            .execute(conn)
            .await?;
            Ok(S::rows_affected(&done) == 1)
        })
    }

    fn complete_token<'c>(
        conn: &'c mut Conn<Self>,
        token: Token,
        response_status: i32,
        body: String,
        now: i64,
    ) -> Sql<'c, ()> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE idempotency_tokens SET state = 'completed', response_status = $2, response_body = $3, \
                 updated_at = $4 WHERE token = $1 AND state = 'in_use'",
            )
            .bind(token)
            .bind(response_status)
            .bind(body)
            .bind(now)
            .execute(conn)
            .await?;
            Ok(())
        })
    }

    async fn insert_order(&self, o: &Order) -> Result<bool, sqlx::Error> {
        let q = sqlx::query(
            "INSERT INTO orders (tenant, order_no, amount, currency, status, version, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (tenant, order_no) DO NOTHING",
        )
        .bind(o.tenant.clone())
        .bind(o.order_no.clone())
        .bind(o.amount)
        .bind(o.currency.clone())
        .bind(o.status)
        .bind(o.version)
        .bind(o.created_at)
        .bind(o.updated_at);
        let mut w = self.writer().await.map_err(engine_error)?;
        let done = q.execute(&mut *w).await;
        Ok(S::rows_affected(&w.check(done)?) == 1)
    }

    async fn order(&self, tenant: &str, order_no: &OrderNo) -> Result<Option<Order>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM orders WHERE tenant = $1 AND order_no = $2")
            .bind(tenant.to_owned())
            .bind(order_no.clone())
            .fetch_optional(self.pool())
            .await
    }

    async fn insert_token(&self, t: &TokenRecord) -> Result<(), sqlx::Error> {
        let q = sqlx::query(
            "INSERT INTO idempotency_tokens (token, tenant, state, fingerprint, route, response_status, \
             response_body, created_at, expires_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(t.token.clone())
        .bind(t.tenant.clone())
        .bind(t.state)
        .bind(t.fingerprint.clone())
        .bind(t.route.clone())
        .bind(t.response_status)
        .bind(t.response_body.clone())
        .bind(t.created_at)
        .bind(t.expires_at)
        .bind(t.updated_at);
        let mut w = self.writer().await.map_err(engine_error)?;
        let done = q.execute(&mut *w).await;
        w.check(done)?;
        Ok(())
    }

    async fn ensure_token(&self, t: &TokenRecord) -> Result<(), sqlx::Error> {
        let q = sqlx::query(
            "INSERT INTO idempotency_tokens (token, tenant, state, fingerprint, route, response_status, \
             response_body, created_at, expires_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (token) DO UPDATE SET expires_at = excluded.expires_at, updated_at = excluded.updated_at \
             WHERE idempotency_tokens.state = 'issued' AND idempotency_tokens.expires_at <= excluded.created_at",
        )
        .bind(t.token.clone())
        .bind(t.tenant.clone())
        .bind(t.state)
        .bind(t.fingerprint.clone())
        .bind(t.route.clone())
        .bind(t.response_status)
        .bind(t.response_body.clone())
        .bind(t.created_at)
        .bind(t.expires_at)
        .bind(t.updated_at);
        let mut w = self.writer().await.map_err(engine_error)?;
        let done = q.execute(&mut *w).await;
        w.check(done)?;
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
        let q = sqlx::query(
            "UPDATE idempotency_tokens SET state = 'completed', fingerprint = $2, route = $3, \
             response_status = $4, response_body = $5, updated_at = $6 WHERE token = $1 AND state = 'issued' \
             AND fingerprint IS NULL \
             AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.tenant = idempotency_tokens.tenant AND p.request_no = $7)",
        )
        .bind(token.clone())
        .bind(fingerprint.to_owned())
        .bind(route.to_owned())
        .bind(i32::from(response.status))
        .bind(response.body.clone())
        .bind(now)
        .bind(request_no.as_str().to_owned());
        let mut w = self.writer().await.map_err(engine_error)?;
        let done = q.execute(&mut *w).await;
        Ok(S::rows_affected(&w.check(done)?) == 1)
    }

    async fn mark_number_taken(&self, token: &Token) -> Result<bool, sqlx::Error> {
        let q = sqlx::query("UPDATE idempotency_tokens SET fingerprint = $2 WHERE token = $1 AND state = 'issued'")
            .bind(token.clone())
            .bind(NUMBER_TAKEN.to_owned());
        let mut w = self.writer().await.map_err(engine_error)?;
        let done = q.execute(&mut *w).await;
        Ok(S::rows_affected(&w.check(done)?) == 1)
    }

    async fn token_and_order(
        &self,
        token: &Token,
        tenant: &str,
        order_no: &OrderNo,
    ) -> Result<Option<(TokenRecord, bool)>, sqlx::Error> {
        let found: Option<TokenCheck> = sqlx::query_as(
            "SELECT t.*, EXISTS (SELECT 1 FROM orders o WHERE o.tenant = $2 AND o.order_no = $3) AS order_exists \
             FROM idempotency_tokens t WHERE t.token = $1",
        )
        .bind(token.clone())
        .bind(tenant.to_owned())
        .bind(order_no.clone())
        .fetch_optional(self.pool())
        .await?;
        Ok(found.map(|f| (f.token, f.order_exists)))
    }

    async fn payment(&self, tenant: &str, request_no: &RequestNo) -> Result<Option<PaymentRecord>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM payments WHERE tenant = $1 AND request_no = $2")
            .bind(tenant.to_owned())
            .bind(request_no.clone())
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
            "SELECT * FROM payments WHERE charge_id = $1 AND ($2 IS NULL OR tenant = $2) \
             ORDER BY created_at DESC, request_no DESC LIMIT $3",
        )
        .bind(charge_id.to_owned())
        .bind(tenant.map(str::to_owned))
        .bind(limit)
        .fetch_all(self.pool())
        .await
    }

    async fn payments_of_order(&self, tenant: &str, order_no: &OrderNo) -> Result<Vec<PaymentRecord>, sqlx::Error> {
        sqlx::query_as(
            "SELECT * FROM payments WHERE order_no = $1 AND tenant = $2 ORDER BY created_at DESC, request_no DESC",
        )
        .bind(order_no.clone())
        .bind(tenant.to_owned())
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
                "SELECT * FROM payments WHERE order_no = $1 AND tenant = $2 \
                 ORDER BY created_at DESC, request_no DESC LIMIT $3",
            )
            .bind(order_no.clone())
            .bind(tenant.to_owned())
            .bind(limit)
            .fetch_all(self.pool())
            .await;
        };
        // `created_at <= $3` bounds the index range; the rest only sorts out the cursor's own millisecond.
        sqlx::query_as(
            "SELECT * FROM payments WHERE order_no = $1 AND tenant = $2 \
             AND created_at <= $3 AND (created_at < $3 OR request_no < $4) \
             ORDER BY created_at DESC, request_no DESC LIMIT $5",
        )
        .bind(order_no.clone())
        .bind(tenant.to_owned())
        .bind(after.created_at)
        .bind(after.request_no.clone())
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
             WHERE status = 'processing' AND created_at <= $1 AND ($2 IS NULL OR tenant = $2) \
             ORDER BY created_at LIMIT $3",
        )
        .bind(created_before)
        .bind(tenant.map(str::to_owned))
        .bind(limit)
        .fetch_all(self.pool())
        .await
    }

    async fn delete_tokens(&self, kind: TokenKind, by: i64, limit: i64) -> Result<u64, sqlx::Error> {
        let q = sqlx::query(token_sql(kind).0).bind(by).bind(limit);
        let mut w = self.writer().await.map_err(engine_error)?;
        let done = q.execute(&mut *w).await;
        Ok(S::rows_affected(&w.check(done)?))
    }

    async fn count_tokens(&self, kind: TokenKind, by: i64) -> Result<u64, sqlx::Error> {
        let (count,): (i64,) = sqlx::query_as(token_sql(kind).1).bind(by).fetch_one(self.pool()).await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn lock_pass(&self) -> Result<Option<PassLock>, sqlx::Error> {
        StandardSql::lock_pass(self).await
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
                "UPDATE payments SET status = 'succeeded', charge_id = $4, updated_at = $5 \
                 WHERE tenant = $1 AND request_no = $2 AND token = $3 AND status = 'processing'",
            )
            .bind(tenant)
            .bind(request_no)
            .bind(token)
            .bind(charge_id)
            .bind(now)
            .execute(conn)
            .await?;
            Ok(S::rows_affected(&done) == 1)
        })
    }
}
