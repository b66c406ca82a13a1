//! The refund queries Postgres and SQLite share, written once for both as one implementation of
//! [`RefundStore`] over [`StandardSql`] (as `standard.rs` does for payments); their phases as statement phases
//! (`refund_statement.rs`).

use onceflow_engine::{Conn, Failure, Interrupt, StepSpec, WorkflowContext};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use super::Sql;
use super::refund::{RefundEnd, RefundPhase, RefundSteps, RefundStore, TokenPaymentCheck};
use super::refund_statement;
use super::standard::StandardSql;
use crate::model::{RefundInput, RefundNo, RefundRecord, RequestNo, StoredResponse, Token, TokenRecord};

impl<S> RefundStore for S
where
    S: StandardSql,
    for<'c> &'c mut <S::Db as Database>::Connection: Executor<'c, Database = S::Db>,
    <S::Db as Database>::Arguments: IntoArguments<S::Db>,
    for<'q> String: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> Option<String>: Encode<'q, S::Db> + Type<S::Db>,
    for<'q> i64: Encode<'q, S::Db> + Type<S::Db>,
    for<'r> RefundRecord: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> TokenPaymentCheck: FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64, Option<i64>): FromRow<'r, <S::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <S::Db as Database>::Row>,
{
    async fn reserve_refund(
        ctx: &mut WorkflowContext<Self>,
        input: &RefundInput,
        now: i64,
        steps: RefundSteps,
        refused: Failure,
    ) -> Result<RefundPhase, Interrupt> {
        refund_statement::run_reserve(ctx, S::DIALECT, input, now, steps, refused).await
    }

    async fn confirm_refund(
        ctx: &mut WorkflowContext<Self>,
        input: &RefundInput,
        now: i64,
        spec: StepSpec,
        refund_id: String,
        response: StoredResponse,
        not_processing: Failure,
    ) -> Result<StoredResponse, Interrupt> {
        refund_statement::run_confirm(ctx, S::DIALECT, input, now, spec, &refund_id, response, not_processing).await
    }

    fn end_refund<'c>(conn: &'c mut Conn<Self>, i: RefundInput, end: RefundEnd, now: i64) -> Sql<'c, bool> {
        Box::pin(async move {
            let (status, refund_id) = match &end {
                RefundEnd::Succeeded { refund_id } => ("succeeded", Some(refund_id.clone())),
                RefundEnd::Released | RefundEnd::Rejected => ("failed", None),
            };
            let done = sqlx::query(
                "UPDATE refunds SET status = $1, refund_id = COALESCE($2, refund_id), updated_at = $3 \
                 WHERE tenant = $4 AND refund_no = $5 AND token = $6 AND status = 'processing'",
            )
            .bind(status.to_owned())
            .bind(refund_id)
            .bind(now)
            .bind(i.tenant.clone())
            .bind(i.refund_no.to_string())
            .bind(i.token.as_str().to_owned())
            .execute(&mut *conn)
            .await?;
            if S::rows_affected(&done) != 1 {
                return Ok(false);
            }
            let moved = match end {
                RefundEnd::Rejected => return Ok(true),
                RefundEnd::Released => 0,
                RefundEnd::Succeeded { .. } => i.amount,
            };
            sqlx::query(
                "UPDATE payments SET refund_reserved = refund_reserved - $1, refunded_amount = refunded_amount + $2, \
                 updated_at = $3 WHERE tenant = $4 AND request_no = $5",
            )
            .bind(i.amount)
            .bind(moved)
            .bind(now)
            .bind(i.tenant.clone())
            .bind(i.request_no.to_string())
            .execute(&mut *conn)
            .await?;
            if moved > 0 {
                // As in `refund_statement.rs`: the order the payment paid is refunded once its refunds cover it.
                sqlx::query(
                    "UPDATE orders SET status = 'refunded', version = version + 1, updated_at = $1 \
                     WHERE tenant = $2 AND status = 'paid' AND (reserved_by = $3 OR reserved_by IS NULL) \
                     AND order_no = (SELECT order_no FROM payments \
                     WHERE tenant = $2 AND request_no = $3 AND refunded_amount >= amount)",
                )
                .bind(now)
                .bind(i.tenant)
                .bind(i.request_no.to_string())
                .execute(&mut *conn)
                .await?;
            }
            Ok(true)
        })
    }

    fn add_refunded<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        request_no: RequestNo,
        amount: i64,
        now: i64,
    ) -> Sql<'c, ()> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE payments SET refunded_amount = refunded_amount + $1, updated_at = $2 \
                 WHERE tenant = $3 AND request_no = $4 AND status = 'succeeded' \
                 AND $1 <= amount - refunded_amount - refund_reserved",
            )
            .bind(amount)
            .bind(now)
            .bind(tenant)
            .bind(request_no.to_string())
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
    }

    fn refundable<'c>(conn: &'c mut Conn<Self>, tenant: String, request_no: RequestNo) -> Sql<'c, i64> {
        Box::pin(async move {
            let left: Option<(i64,)> = sqlx::query_as(
                "SELECT amount - refunded_amount - refund_reserved FROM payments WHERE tenant = $1 AND request_no = $2",
            )
            .bind(tenant)
            .bind(request_no.to_string())
            .fetch_optional(&mut *conn)
            .await?;
            Ok(left.map_or(0, |(left,)| left.max(0)))
        })
    }

    fn refund_in<'c>(conn: &'c mut Conn<Self>, tenant: String, refund_no: RefundNo) -> Sql<'c, Option<RefundRecord>> {
        Box::pin(async move {
            Ok(sqlx::query_as("SELECT * FROM refunds WHERE tenant = $1 AND refund_no = $2")
                .bind(tenant)
                .bind(refund_no.to_string())
                .fetch_optional(&mut *conn)
                .await?)
        })
    }

    async fn refund(&self, tenant: &str, refund_no: &RefundNo) -> Result<Option<RefundRecord>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM refunds WHERE tenant = $1 AND refund_no = $2")
            .bind(tenant.to_owned())
            .bind(refund_no.to_string())
            .fetch_optional(self.pool())
            .await
    }

    async fn refunds_of_payment(&self, tenant: &str, request_no: &RequestNo) -> Result<Vec<RefundRecord>, sqlx::Error> {
        sqlx::query_as(
            "SELECT * FROM refunds WHERE request_no = $1 AND tenant = $2 ORDER BY created_at DESC, refund_no DESC",
        )
        .bind(request_no.to_string())
        .bind(tenant.to_owned())
        .fetch_all(self.pool())
        .await
    }

    async fn token_and_payment(
        &self,
        token: &Token,
        tenant: &str,
        request_no: &RequestNo,
    ) -> Result<Option<(TokenRecord, bool)>, sqlx::Error> {
        let found: Option<TokenPaymentCheck> = sqlx::query_as(
            "SELECT t.*, EXISTS (SELECT 1 FROM payments p WHERE p.tenant = $2 AND p.request_no = $3) \
             AS payment_exists FROM idempotency_tokens t WHERE t.token = $1",
        )
        .bind(token.as_str().to_owned())
        .bind(tenant.to_owned())
        .bind(request_no.to_string())
        .fetch_optional(self.pool())
        .await?;
        Ok(found.map(|f| (f.token, f.payment_exists)))
    }

    async fn unresolved_refunds(&self) -> Result<(i64, Option<i64>), sqlx::Error> {
        sqlx::query_as("SELECT count(*), min(created_at) FROM refunds WHERE status = 'processing'")
            .fetch_one(self.pool())
            .await
    }

    async fn unresolved_refunds_before(
        &self,
        tenant: Option<&str>,
        created_before: i64,
        limit: i64,
    ) -> Result<Vec<RefundRecord>, sqlx::Error> {
        sqlx::query_as(
            "SELECT * FROM refunds WHERE status = 'processing' AND created_at <= $1 AND ($2 IS NULL OR tenant = $2) \
             ORDER BY created_at LIMIT $3",
        )
        .bind(created_before)
        .bind(tenant.map(str::to_owned))
        .bind(limit)
        .fetch_all(self.pool())
        .await
    }

    async fn all_refunds(&self) -> Result<Vec<RefundRecord>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM refunds ORDER BY tenant, refund_no").fetch_all(self.pool()).await
    }
}
