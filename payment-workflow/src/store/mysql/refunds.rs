//! Refunds on MySQL / MariaDB: the refund saga's phases as closure steps sharing the workflow's transaction,
//! which commits with the channel call's intent (phase 1) or the workflow's end (phase 2); the writes of its
//! compensations; the reads. Step outputs are the JSON the statement phases of Postgres and SQLite return.

use onceflow_engine::{BoxFuture, Conn, Failure, Interrupt, MySqlStore, StepError, StepSpec, Store, WorkflowContext};
use sqlx::MySqlConnection;

use super::inserted;
use super::steps::{claim_token, complete_token};
use crate::events::EventStore;
use crate::model::{
    Currency, OrderNo, RefundInput, RefundNo, RefundRecord, RefundRecorded, RequestNo, StoredResponse, Token,
    TokenRecord,
};
use crate::store::Sql;
use crate::store::refund::{RefundEnd, RefundPhase, RefundReserve, RefundSteps, RefundStore, TokenPaymentCheck};

impl RefundStore for MySqlStore {
    async fn reserve_refund(
        ctx: &mut WorkflowContext<Self>,
        i: &RefundInput,
        now: i64,
        steps: RefundSteps,
        refused: Failure,
    ) -> Result<RefundPhase, Interrupt> {
        let (token, tenant, fingerprint, route) =
            (i.token.clone(), i.tenant.clone(), i.fingerprint.clone(), i.route.clone());
        let claim = ctx.transactional(steps.claim, move |c| -> BoxFuture<'_, _> {
            Box::pin(async move { Ok(claim_token(c, token, tenant, fingerprint, route, now).await?) })
        });
        if !claim.await? {
            return Err(Interrupt::Refused(refused));
        }
        let input = i.clone();
        let insert = ctx.transactional(steps.insert, move |c| -> BoxFuture<'_, _> {
            Box::pin(async move {
                // Another tenant's payment, or none, refuses the refund, whether or not its number is free.
                let Some((order_no, currency)) = payment_of(c, &input.tenant, &input.request_no).await? else {
                    return Err(StepError::Terminal(Failure::new("payment_not_found", "no such payment")));
                };
                let recorded = RefundRecorded { created_at: now, currency, order_no };
                Ok(insert_refund(c, &input, &recorded).await?.then_some(recorded))
            })
        });
        let recorded = match insert.await {
            Err(Interrupt::Failed(f)) if f.code == "payment_not_found" => return Err(Interrupt::Refused(refused)),
            other => other?,
        };
        if recorded.is_none() {
            return Ok(RefundPhase { recorded, reserve: None });
        }
        let (tenant, request_no, amount) = (i.tenant.clone(), i.request_no.clone(), i.amount);
        let reserve = ctx.transactional(steps.reserve, move |c| -> BoxFuture<'_, _> {
            Box::pin(async move { Ok(reserve_amount(c, tenant, request_no, amount, now).await?) })
        });
        Ok(RefundPhase { recorded, reserve: Some(reserve.await?) })
    }

    async fn confirm_refund(
        ctx: &mut WorkflowContext<Self>,
        i: &RefundInput,
        now: i64,
        spec: StepSpec,
        refund_id: String,
        response: StoredResponse,
        not_processing: Failure,
    ) -> Result<StoredResponse, Interrupt> {
        let input = i.clone();
        let event = i.succeeded_event(&response, now);
        ctx.transactional(spec, move |c| -> BoxFuture<'_, _> {
            Box::pin(async move {
                let token = input.token.clone();
                if !end(&mut *c, input, RefundEnd::Succeeded { refund_id }, now).await? {
                    return Err(StepError::Terminal(not_processing));
                }
                complete_token(&mut *c, token, i32::from(response.status), response.body.clone(), now).await?;
                // The outbox: the refund's `refund.succeeded`, in the outcome's transaction.
                MySqlStore::write_event(&mut *c, &event).await?;
                Ok(response)
            })
        })
        .await
    }

    fn end_refund<'c>(conn: &'c mut Conn<Self>, input: RefundInput, end_as: RefundEnd, now: i64) -> Sql<'c, bool> {
        Box::pin(async move { Ok(end(conn, input, end_as, now).await?) })
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
                "UPDATE payments SET refunded_amount = refunded_amount + ?, updated_at = ? \
                 WHERE tenant = ? AND request_no = ? AND status = 'succeeded' \
                 AND ? <= amount - refunded_amount - refund_reserved",
            )
            .bind(amount)
            .bind(now)
            .bind(tenant)
            .bind(request_no)
            .bind(amount)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
    }

    fn refundable<'c>(conn: &'c mut Conn<Self>, tenant: String, request_no: RequestNo) -> Sql<'c, i64> {
        Box::pin(async move {
            let left: Option<i64> = sqlx::query_scalar(
                "SELECT amount - refunded_amount - refund_reserved FROM payments WHERE tenant = ? AND request_no = ?",
            )
            .bind(tenant)
            .bind(request_no)
            .fetch_optional(&mut *conn)
            .await?;
            Ok(left.unwrap_or(0).max(0))
        })
    }

    fn refund_in<'c>(conn: &'c mut Conn<Self>, tenant: String, refund_no: RefundNo) -> Sql<'c, Option<RefundRecord>> {
        Box::pin(async move {
            Ok(sqlx::query_as("SELECT * FROM refunds WHERE tenant = ? AND refund_no = ?")
                .bind(tenant)
                .bind(refund_no)
                .fetch_optional(&mut *conn)
                .await?)
        })
    }

    async fn refund(&self, tenant: &str, refund_no: &RefundNo) -> Result<Option<RefundRecord>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM refunds WHERE tenant = ? AND refund_no = ?")
            .bind(tenant)
            .bind(refund_no)
            .fetch_optional(self.pool())
            .await
    }

    async fn refunds_of_payment(&self, tenant: &str, request_no: &RequestNo) -> Result<Vec<RefundRecord>, sqlx::Error> {
        sqlx::query_as(
            "SELECT * FROM refunds WHERE tenant = ? AND request_no = ? ORDER BY created_at DESC, refund_no DESC",
        )
        .bind(tenant)
        .bind(request_no)
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
            "SELECT t.*, EXISTS (SELECT 1 FROM payments p WHERE p.tenant = ? AND p.request_no = ?) AS payment_exists \
             FROM idempotency_tokens t WHERE t.token = ?",
        )
        .bind(tenant)
        .bind(request_no)
        .bind(token)
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
            "SELECT * FROM refunds WHERE status = 'processing' AND created_at <= ? AND (? IS NULL OR tenant = ?) \
             ORDER BY created_at LIMIT ?",
        )
        .bind(created_before)
        .bind(tenant)
        .bind(tenant)
        .bind(limit)
        .fetch_all(self.pool())
        .await
    }

    async fn all_refunds(&self) -> Result<Vec<RefundRecord>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM refunds ORDER BY tenant, refund_no").fetch_all(self.pool()).await
    }
}

/// The order and currency of the tenant's payment `request_no`, if it has it (a plain read: no lock, so that the
/// reservation's update is the first lock this transaction takes on the payment).
async fn payment_of(
    conn: &mut MySqlConnection,
    tenant: &str,
    request_no: &RequestNo,
) -> Result<Option<(OrderNo, Currency)>, sqlx::Error> {
    sqlx::query_as("SELECT order_no, currency FROM payments WHERE tenant = ? AND request_no = ?")
        .bind(tenant)
        .bind(request_no)
        .fetch_optional(conn)
        .await
}

/// Records the refund of `i`, `processing`; `false` when the tenant's `refund_no` exists.
async fn insert_refund(conn: &mut MySqlConnection, i: &RefundInput, r: &RefundRecorded) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO refunds (tenant, refund_no, request_no, order_no, amount, currency, status, reason, token, \
         merchant_refund_no, refund_id, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, 'processing', ?, ?, ?, NULL, ?, ?)",
    )
    .bind(&i.tenant)
    .bind(&i.refund_no)
    .bind(&i.request_no)
    .bind(&r.order_no)
    .bind(i.amount)
    .bind(&r.currency)
    .bind(&i.reason)
    .bind(&i.token)
    .bind(&i.merchant_refund_no)
    .bind(r.created_at)
    .bind(r.created_at)
    .execute(conn)
    .await;
    inserted(done)
}

/// The reservation: one conditional update of the payment, its rows matched telling; otherwise why not.
async fn reserve_amount(
    conn: &mut MySqlConnection,
    tenant: String,
    request_no: RequestNo,
    amount: i64,
    now: i64,
) -> Result<RefundReserve, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE payments SET refund_reserved = refund_reserved + ?, updated_at = ? \
         WHERE tenant = ? AND request_no = ? AND status = 'succeeded' \
         AND ? <= amount - refunded_amount - refund_reserved",
    )
    .bind(amount)
    .bind(now)
    .bind(&tenant)
    .bind(&request_no)
    .bind(amount)
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 1 {
        return Ok(RefundReserve::Reserved);
    }
    let status: Option<String> = sqlx::query_scalar("SELECT status FROM payments WHERE tenant = ? AND request_no = ?")
        .bind(&tenant)
        .bind(&request_no)
        .fetch_optional(conn)
        .await?;
    Ok(if status.as_deref() == Some("succeeded") { RefundReserve::Exceeds } else { RefundReserve::NotRefundable })
}

/// See [`RefundStore::end_refund`].
async fn end(conn: &mut MySqlConnection, i: RefundInput, end: RefundEnd, now: i64) -> Result<bool, sqlx::Error> {
    let (status, refund_id) = match &end {
        RefundEnd::Succeeded { refund_id } => ("succeeded", Some(refund_id.clone())),
        RefundEnd::Released | RefundEnd::Rejected => ("failed", None),
    };
    let done = sqlx::query(
        "UPDATE refunds SET status = ?, refund_id = COALESCE(?, refund_id), updated_at = ? \
         WHERE tenant = ? AND refund_no = ? AND token = ? AND status = 'processing'",
    )
    .bind(status)
    .bind(refund_id)
    .bind(now)
    .bind(&i.tenant)
    .bind(&i.refund_no)
    .bind(&i.token)
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    let moved = match end {
        RefundEnd::Rejected => return Ok(true),
        RefundEnd::Released => 0,
        RefundEnd::Succeeded { .. } => i.amount,
    };
    sqlx::query(
        "UPDATE payments SET refund_reserved = refund_reserved - ?, refunded_amount = refunded_amount + ?, \
         updated_at = ? WHERE tenant = ? AND request_no = ?",
    )
    .bind(i.amount)
    .bind(moved)
    .bind(now)
    .bind(&i.tenant)
    .bind(&i.request_no)
    .execute(&mut *conn)
    .await?;
    if moved > 0 {
        sqlx::query(
            "UPDATE orders SET status = 'refunded', version = version + 1, updated_at = ? \
             WHERE tenant = ? AND status = 'paid' AND (reserved_by = ? OR reserved_by IS NULL) \
             AND order_no = (SELECT order_no FROM payments \
             WHERE tenant = ? AND request_no = ? AND refunded_amount >= amount)",
        )
        .bind(now)
        .bind(&i.tenant)
        .bind(&i.request_no)
        .bind(&i.tenant)
        .bind(&i.request_no)
        .execute(&mut *conn)
        .await?;
    }
    Ok(true)
}
