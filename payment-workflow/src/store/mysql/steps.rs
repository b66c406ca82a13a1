//! The payment writes of MySQL / MariaDB's closure steps (the refunds' phases, the compensations) and of the
//! queries outside steps: each one statement on the step's connection. The payment's own phases are statement
//! phases (`../statement.rs`).

use onceflow_engine::StepError;
use sqlx::MySqlConnection;

use crate::model::{OrderNo, OrderStatus, PaymentStatus, RequestNo, Token};

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
