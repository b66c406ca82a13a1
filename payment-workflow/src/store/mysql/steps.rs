//! The saga's steps on MySQL / MariaDB: each phase's writes as closure steps sharing the workflow's
//! transaction, which commits with the next external step (phase 1, with the channel call's intent) or the
//! workflow's end (phase 2, with the payment's event: the outbox). Step outputs are the JSON the statement
//! phases of Postgres and SQLite return, so a workflow's rows read the same on every backend.

use onceflow_engine::{BoxFuture, Failure, Interrupt, MySqlStore, StepError, StepSpec, WorkflowContext};
use sqlx::MySqlConnection;

use super::inserted;
use crate::events::EventStore;
use crate::model::{Currency, OrderNo, OrderStatus, PaymentStatus, RequestNo, StoredResponse, Token};
use crate::model::{PaymentEnd, PaymentInput};
use crate::store::{Reserve, ReserveSteps};

/// Phase 1 (see [`crate::PaymentStore::reserve`]): three closure steps in one transaction. A token that cannot
/// be claimed, or an order that does not exist, refuses the body: the transaction rolls back unwritten.
pub(super) async fn reserve(
    ctx: &mut WorkflowContext<MySqlStore>,
    i: &PaymentInput,
    now: i64,
    steps: ReserveSteps,
    refused: Failure,
) -> Result<Option<Reserve>, Interrupt> {
    let (token, tenant, fingerprint, route) =
        (i.token.clone(), i.tenant.clone(), i.fingerprint.clone(), i.route.clone());
    let claim = ctx.transactional(steps.claim, move |c| -> BoxFuture<'_, _> {
        Box::pin(async move { Ok(claim_token(c, token, tenant, fingerprint, route, now).await?) })
    });
    if !claim.await? {
        return Err(Interrupt::Refused(refused));
    }
    let (tenant, order_no, amount, currency) = (i.tenant.clone(), i.order_no.clone(), i.amount, i.currency.clone());
    let (request_no, token) = (i.request_no.clone(), i.token.clone());
    let insert = ctx.transactional(steps.insert, move |c| -> BoxFuture<'_, _> {
        Box::pin(async move {
            let inserted = insert_payment(c, &tenant, &request_no, &order_no, amount, &currency, &token, now).await?;
            // An unknown order refuses the payment, whether or not its number is free.
            if !inserted && order_of(c, &tenant, &order_no).await?.is_none() {
                return Err(StepError::Terminal(Failure::new("order_not_found", "no such order")));
            }
            Ok(inserted)
        })
    });
    let inserted = match insert.await {
        Err(Interrupt::Failed(f)) if f.code == "order_not_found" => return Err(Interrupt::Refused(refused)),
        other => other?,
    };
    if !inserted {
        return Ok(None);
    }
    let (tenant, order_no, currency, amount) = (i.tenant.clone(), i.order_no.clone(), i.currency.clone(), i.amount);
    let request_no = i.request_no.clone();
    let reserve = ctx.transactional(steps.reserve, move |c| -> BoxFuture<'_, _> {
        Box::pin(async move { Ok(reserve_order(c, tenant, order_no, amount, currency, request_no, now).await?) })
    });
    match reserve.await? {
        Reserve::NotFound => Err(Interrupt::Refused(refused)),
        reserved => Ok(Some(reserved)),
    }
}

/// Phase 2 (see [`crate::PaymentStore::confirm`]): one closure step, committed with the workflow's end.
pub(super) async fn confirm(
    ctx: &mut WorkflowContext<MySqlStore>,
    i: &PaymentInput,
    now: i64,
    spec: StepSpec,
    charge_id: String,
    response: StoredResponse,
    not_paying: Failure,
) -> Result<StoredResponse, Interrupt> {
    let (tenant, order_no, request_no, token) =
        (i.tenant.clone(), i.order_no.clone(), i.request_no.clone(), i.token.clone());
    let event = i.event(&PaymentEnd::Succeeded { charge_id: charge_id.clone(), refunded: 0 }, now);
    ctx.transactional(spec, move |c| -> BoxFuture<'_, _> {
        Box::pin(async move {
            if !move_order(&mut *c, tenant.clone(), order_no, request_no.clone(), OrderStatus::Paid, now).await? {
                return Err(StepError::Terminal(not_paying));
            }
            let succeeded = PaymentStatus::Succeeded;
            let ended = Ended { charge_id: Some(charge_id), ..Ended::default() };
            set_payment_status(&mut *c, tenant, request_no, token.clone(), succeeded, ended, now).await?;
            complete_token(&mut *c, token, i32::from(response.status), response.body.clone(), now).await?;
            // The outbox: the payment's `payment.succeeded`, in the outcome's transaction (once: its id is the
            // payment's).
            MySqlStore::write_event(&mut *c, &event).await?;
            Ok(response)
        })
    })
    .await
}

/// Token `issued → in_use`, bound to `fingerprint` and `route`, if it is the tenant's, unused and unexpired.
pub(super) async fn claim_token(
    conn: &mut MySqlConnection,
    token: Token,
    tenant: String,
    fingerprint: String,
    route: String,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE idempotency_tokens SET state = 'in_use', fingerprint = ?, route = ?, updated_at = ? \
         WHERE token = ? AND tenant = ? AND state = 'issued' AND expires_at > ?",
    )
    .bind(fingerprint)
    .bind(route)
    .bind(now)
    .bind(token)
    .bind(tenant)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Inserts this payment's record, `processing`; `false` when the tenant's `request_no` exists.
#[allow(clippy::too_many_arguments)]
async fn insert_payment(
    conn: &mut MySqlConnection,
    tenant: &str,
    request_no: &RequestNo,
    order_no: &OrderNo,
    amount: i64,
    currency: &Currency,
    token: &Token,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO payments (tenant, request_no, order_no, amount, currency, status, token, charge_id, \
         decline_code, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'processing', ?, NULL, NULL, ?, ?)",
    )
    .bind(tenant)
    .bind(request_no)
    .bind(order_no)
    .bind(amount)
    .bind(currency)
    .bind(token)
    .bind(now)
    .bind(now)
    .execute(conn)
    .await;
    inserted(done)
}

/// The order's amount and currency, if the tenant has it.
async fn order_of(
    conn: &mut MySqlConnection,
    tenant: &str,
    order_no: &OrderNo,
) -> Result<Option<(i64, String)>, sqlx::Error> {
    sqlx::query_as("SELECT amount, currency FROM orders WHERE tenant = ? AND order_no = ?")
        .bind(tenant)
        .bind(order_no)
        .fetch_optional(conn)
        .await
}

/// Order `pending → paying` if amount and currency match, reserved by the payment `request_no`.
async fn reserve_order(
    conn: &mut MySqlConnection,
    tenant: String,
    order_no: OrderNo,
    amount: i64,
    currency: Currency,
    request_no: RequestNo,
    now: i64,
) -> Result<Reserve, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE orders SET status = 'paying', version = version + 1, reserved_by = ?, updated_at = ? \
         WHERE tenant = ? AND order_no = ? AND status = 'pending' AND amount = ? AND currency = ?",
    )
    .bind(request_no)
    .bind(now)
    .bind(&tenant)
    .bind(&order_no)
    .bind(amount)
    .bind(&currency)
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 1 {
        return Ok(Reserve::Reserved);
    }
    Ok(Reserve::refused(order_of(conn, &tenant, &order_no).await?, amount, &currency))
}

/// See [`crate::PaymentStore::move_order`].
pub(super) async fn move_order(
    conn: &mut MySqlConnection,
    tenant: String,
    order_no: OrderNo,
    request_no: RequestNo,
    to: OrderStatus,
    now: i64,
) -> Result<bool, StepError> {
    let done = sqlx::query(
        "UPDATE orders SET status = ?, version = version + 1, updated_at = ? \
         WHERE tenant = ? AND order_no = ? AND status = 'paying' AND reserved_by = ?",
    )
    .bind(to)
    .bind(now)
    .bind(tenant)
    .bind(order_no)
    .bind(request_no)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// What a payment's end records besides its status: the charge of a succeeded one, the decline code of a
/// declined one, the answer's code of a failed one.
#[derive(Debug, Default)]
pub(super) struct Ended {
    pub(super) charge_id: Option<String>,
    pub(super) decline_code: Option<String>,
    pub(super) failure_code: Option<String>,
}

/// The status (and what `ended` records) of this payment's record while it is `processing`; whether it did. See
/// [`crate::PaymentStore::fail_payment`].
pub(super) async fn set_payment_status(
    conn: &mut MySqlConnection,
    tenant: String,
    request_no: RequestNo,
    token: Token,
    status: PaymentStatus,
    ended: Ended,
    now: i64,
) -> Result<bool, StepError> {
    let done = sqlx::query(
        "UPDATE payments SET status = ?, charge_id = COALESCE(?, charge_id), \
         decline_code = COALESCE(?, decline_code), failure_code = COALESCE(?, failure_code), updated_at = ? \
         WHERE tenant = ? AND request_no = ? AND token = ? AND status = 'processing'",
    )
    .bind(status)
    .bind(ended.charge_id)
    .bind(ended.decline_code)
    .bind(ended.failure_code)
    .bind(now)
    .bind(tenant)
    .bind(request_no)
    .bind(token)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// See [`crate::PaymentStore::complete_token`].
pub(super) async fn complete_token(
    conn: &mut MySqlConnection,
    token: Token,
    response_status: i32,
    body: String,
    now: i64,
) -> Result<(), StepError> {
    sqlx::query(
        "UPDATE idempotency_tokens SET state = 'completed', response_status = ?, response_body = ?, \
         updated_at = ? WHERE token = ? AND state = 'in_use'",
    )
    .bind(response_status)
    .bind(body)
    .bind(now)
    .bind(token)
    .execute(conn)
    .await?;
    Ok(())
}
