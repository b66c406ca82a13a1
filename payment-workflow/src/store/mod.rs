//! The payment tables' queries. The SQL is the same on Postgres and SQLite (`$n` parameters), implemented once
//! per store by `impl_payment_store!` so each runs on its concrete connection type; MySQL (`?` parameters, no
//! `ON CONFLICT`) has its own module.

use std::future::Future;

use onceflow_engine::{BoxFuture, Conn, PgStore, SqliteStore, StepError, Store};

use crate::model::{Order, PaymentRecord, TokenRecord, order_status, payment_status};

mod mysql;
pub(crate) mod phases;

pub use phases::PhaseDialect;

/// How reserving an order for payment went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Reserve {
    /// `pending → paying`, version + 1.
    Reserved,
    /// No such order for this tenant.
    NotFound,
    /// Amount or currency differ from the order's.
    Mismatch,
    /// Paid, or another attempt is in flight.
    NotPayable,
}

impl Reserve {
    /// Why an order (its amount and currency as `found`, if it exists) could not be reserved.
    fn refused(found: Option<(i64, String)>, amount: i64, currency: &str) -> Self {
        match found {
            None => Self::NotFound,
            Some((a, c)) if a != amount || c != currency => Self::Mismatch,
            Some(_) => Self::NotPayable,
        }
    }
}

#[derive(sqlx::FromRow)]
struct TokenCheck {
    #[sqlx(flatten)]
    token: TokenRecord,
    order_exists: bool,
}

type Sql<'c, T> = BoxFuture<'c, Result<T, StepError>>;

/// The database error inside an engine error (getting a writer fails only on the database).
fn engine_error(e: onceflow_engine::Error) -> sqlx::Error {
    match e {
        onceflow_engine::Error::Database(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

/// A [`Store`] that also keeps orders, tokens and payment records. Functions taking a connection run inside a
/// step's transaction.
pub trait PaymentStore: Store {
    /// Token `issued → in_use`, bound to `fingerprint` and `route`, if it is the tenant's, unused and unexpired.
    fn claim_token<'c>(
        conn: &'c mut Conn<Self>,
        token: String,
        tenant: String,
        fingerprint: String,
        route: String,
        now: i64,
    ) -> Sql<'c, bool>;
    /// Inserts the payment record; `false` when its `request_no` exists.
    fn insert_payment<'c>(conn: &'c mut Conn<Self>, payment: PaymentRecord) -> Sql<'c, bool>;
    /// Order `pending → paying` if amount and currency match, reserved by the payment `request_no`.
    fn reserve_order<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        order_no: String,
        amount: i64,
        currency: String,
        request_no: String,
        now: i64,
    ) -> Sql<'c, Reserve>;
    /// Order `paying → to`, version + 1, only while the payment `request_no` holds it (its reservation, not
    /// another payment's); whether it did.
    fn move_order<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        order_no: String,
        request_no: String,
        to: &'static str,
        now: i64,
    ) -> Sql<'c, bool>;
    /// Sets the status (and charge id or decline code) of this payment's record — the tenant's `request_no`
    /// inserted under `token` — while it is `processing`: never another payment's record, never a final one.
    #[allow(clippy::too_many_arguments)]
    fn set_payment_status<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        request_no: String,
        token: String,
        status: &'static str,
        charge_id: Option<String>,
        decline_code: Option<String>,
        now: i64,
    ) -> Sql<'c, ()>;
    /// Token `in_use → completed` with its final response (a completed token keeps its first one).
    fn complete_token<'c>(
        conn: &'c mut Conn<Self>,
        token: String,
        response_status: i32,
        body: String,
        now: i64,
    ) -> Sql<'c, ()>;

    /// The commit after a successful charge: order `paying → paid`, the record `succeeded` with its charge id,
    /// the token `completed` with the 201 `body`. Nothing changes, and `false` comes back, if the order was
    /// not `paying`. Three statements (Postgres and SQLite run [`phases::confirm`] instead).
    #[allow(clippy::too_many_arguments)]
    fn confirm_payment<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        order_no: String,
        request_no: String,
        charge_id: String,
        token: String,
        body: String,
        now: i64,
    ) -> Sql<'c, bool> {
        Box::pin(async move {
            if !Self::move_order(&mut *conn, tenant.clone(), order_no, request_no.clone(), order_status::PAID, now)
                .await?
            {
                return Ok(false);
            }
            Self::set_payment_status(
                &mut *conn,
                tenant,
                request_no,
                token.clone(),
                payment_status::SUCCEEDED,
                Some(charge_id),
                None,
                now,
            )
            .await?;
            Self::complete_token(&mut *conn, token, 201, body, now).await?;
            Ok(true)
        })
    }

    /// The dialect in which the store runs the saga's two phases as the statement phases of [`phases`], each
    /// sent with its commit as one call, instead of the closure steps (`None`: the closures). Phase 1 then
    /// refuses a start whose token it cannot claim or whose order does not exist, recording nothing, so the
    /// service starts a payment before reading its token and reads it only when refused.
    const STATEMENT_PHASES: Option<PhaseDialect> = None;

    /// Inserts an order; `false` when the tenant has one with this `order_no`.
    fn insert_order(&self, order: &Order) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// One order.
    fn order(&self, tenant: &str, order_no: &str) -> impl Future<Output = Result<Option<Order>, sqlx::Error>> + Send;
    /// Stores a newly issued token.
    fn insert_token(&self, token: &TokenRecord) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Stores `token` unless one with its value exists (a queued command's token, derived from its
    /// `request_no`: every delivery of the command ensures the same one). An existing token that is still
    /// `issued` but expired — its command waited in the queue past the expiry — lives again until
    /// `token.expires_at`; a used token is never touched.
    fn ensure_token(&self, token: &TokenRecord) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Completes a token that is still unused (`issued`) with a final answer given before anything was
    /// recorded, bound to `fingerprint` and `route`; whether it did (`false`: a payment claimed it meanwhile).
    fn settle_unused_token(
        &self,
        token: &str,
        fingerprint: &str,
        route: &str,
        response: &crate::model::StoredResponse,
        now: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// One token, and whether the tenant has the order: the two checks before a payment, in one round trip.
    fn token_and_order(
        &self,
        token: &str,
        tenant: &str,
        order_no: &str,
    ) -> impl Future<Output = Result<Option<(TokenRecord, bool)>, sqlx::Error>> + Send;
    /// One payment record.
    fn payment(
        &self,
        tenant: &str,
        request_no: &str,
    ) -> impl Future<Output = Result<Option<PaymentRecord>, sqlx::Error>> + Send;
    /// Every order (for the invariant checker).
    fn all_orders(&self) -> impl Future<Output = Result<Vec<Order>, sqlx::Error>> + Send;
    /// Every payment record (for the invariant checker).
    fn all_payments(&self) -> impl Future<Output = Result<Vec<PaymentRecord>, sqlx::Error>> + Send;
}

macro_rules! impl_payment_store {
    ($store:ty $(, $extra:item)* $(,)?) => {
        impl PaymentStore for $store {
            $($extra)*

            fn claim_token<'c>(
                conn: &'c mut Conn<Self>,
                token: String,
                tenant: String,
                fingerprint: String,
                route: String,
                now: i64,
            ) -> Sql<'c, bool> {
                Box::pin(async move {
                    let done = sqlx::query(
                        "UPDATE idempotency_tokens SET state = 'in_use', fingerprint = $3, route = $4, updated_at = $5 \
                         WHERE token = $1 AND tenant = $2 AND state = 'issued' AND expires_at > $5",
                    )
                    .bind(token)
                    .bind(tenant)
                    .bind(fingerprint)
                    .bind(route)
                    .bind(now)
                    .execute(conn)
                    .await?;
                    Ok(done.rows_affected() == 1)
                })
            }

            fn insert_payment<'c>(conn: &'c mut Conn<Self>, p: PaymentRecord) -> Sql<'c, bool> {
                Box::pin(async move {
                    let done = sqlx::query(
                        "INSERT INTO payments (tenant, request_no, order_no, amount, currency, status, token, \
                         charge_id, decline_code, created_at, updated_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (tenant, request_no) DO NOTHING",
                    )
                    .bind(p.tenant)
                    .bind(p.request_no)
                    .bind(p.order_no)
                    .bind(p.amount)
                    .bind(p.currency)
                    .bind(p.status)
                    .bind(p.token)
                    .bind(p.charge_id)
                    .bind(p.decline_code)
                    .bind(p.created_at)
                    .bind(p.updated_at)
                    .execute(conn)
                    .await?;
                    Ok(done.rows_affected() == 1)
                })
            }

            fn reserve_order<'c>(
                conn: &'c mut Conn<Self>,
                tenant: String,
                order_no: String,
                amount: i64,
                currency: String,
                request_no: String,
                now: i64,
            ) -> Sql<'c, Reserve> {
                Box::pin(async move {
                    let done = sqlx::query(
                        "UPDATE orders SET status = 'paying', version = version + 1, reserved_by = $6, updated_at = $5 \
                         WHERE tenant = $1 AND order_no = $2 AND status = 'pending' AND amount = $3 AND currency = $4",
                    )
                    .bind(&tenant)
                    .bind(&order_no)
                    .bind(amount)
                    .bind(&currency)
                    .bind(now)
                    .bind(request_no)
                    .execute(&mut *conn)
                    .await?;
                    if done.rows_affected() == 1 {
                        return Ok(Reserve::Reserved);
                    }
                    let found: Option<(i64, String)> =
                        sqlx::query_as("SELECT amount, currency FROM orders WHERE tenant = $1 AND order_no = $2")
                            .bind(&tenant)
                            .bind(&order_no)
                            .fetch_optional(&mut *conn)
                            .await?;
                    Ok(Reserve::refused(found, amount, &currency))
                })
            }

            fn move_order<'c>(
                conn: &'c mut Conn<Self>,
                tenant: String,
                order_no: String,
                request_no: String,
                to: &'static str,
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
                    Ok(done.rows_affected() == 1)
                })
            }

            fn set_payment_status<'c>(
                conn: &'c mut Conn<Self>,
                tenant: String,
                request_no: String,
                token: String,
                status: &'static str,
                charge_id: Option<String>,
                decline_code: Option<String>,
                now: i64,
            ) -> Sql<'c, ()> {
                Box::pin(async move {
                    sqlx::query(
                        "UPDATE payments SET status = $3, charge_id = COALESCE($4, charge_id), \
                         decline_code = COALESCE($5, decline_code), updated_at = $6 \
                         WHERE tenant = $1 AND request_no = $2 AND token = $7 AND status = 'processing'",
                    )
                    .bind(tenant)
                    .bind(request_no)
                    .bind(status)
                    .bind(charge_id)
                    .bind(decline_code)
                    .bind(now)
                    .bind(token)
                    .execute(conn)
                    .await?;
                    Ok(())
                })
            }

            fn complete_token<'c>(
                conn: &'c mut Conn<Self>,
                token: String,
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
                .bind(&o.tenant)
                .bind(&o.order_no)
                .bind(o.amount)
                .bind(&o.currency)
                .bind(&o.status)
                .bind(o.version)
                .bind(o.created_at)
                .bind(o.updated_at);
                let mut w = self.writer().await.map_err(engine_error)?;
                let done = q.execute(&mut *w).await;
                Ok(w.check(done)?.rows_affected() == 1)
            }

            async fn order(&self, tenant: &str, order_no: &str) -> Result<Option<Order>, sqlx::Error> {
                sqlx::query_as("SELECT * FROM orders WHERE tenant = $1 AND order_no = $2")
                    .bind(tenant)
                    .bind(order_no)
                    .fetch_optional(self.pool())
                    .await
            }

            async fn insert_token(&self, t: &TokenRecord) -> Result<(), sqlx::Error> {
                let q = sqlx::query(
                    "INSERT INTO idempotency_tokens (token, tenant, state, fingerprint, route, response_status, \
                     response_body, created_at, expires_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&t.token)
                .bind(&t.tenant)
                .bind(&t.state)
                .bind(&t.fingerprint)
                .bind(&t.route)
                .bind(t.response_status)
                .bind(&t.response_body)
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
                .bind(&t.token)
                .bind(&t.tenant)
                .bind(&t.state)
                .bind(&t.fingerprint)
                .bind(&t.route)
                .bind(t.response_status)
                .bind(&t.response_body)
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
                token: &str,
                fingerprint: &str,
                route: &str,
                response: &crate::model::StoredResponse,
                now: i64,
            ) -> Result<bool, sqlx::Error> {
                let q = sqlx::query(
                    "UPDATE idempotency_tokens SET state = 'completed', fingerprint = $2, route = $3, \
                     response_status = $4, response_body = $5, updated_at = $6 WHERE token = $1 AND state = 'issued'",
                )
                .bind(token)
                .bind(fingerprint)
                .bind(route)
                .bind(i32::from(response.status))
                .bind(&response.body)
                .bind(now);
                let mut w = self.writer().await.map_err(engine_error)?;
                let done = q.execute(&mut *w).await;
                Ok(w.check(done)?.rows_affected() == 1)
            }

            async fn token_and_order(
                &self,
                token: &str,
                tenant: &str,
                order_no: &str,
            ) -> Result<Option<(TokenRecord, bool)>, sqlx::Error> {
                let found: Option<TokenCheck> = sqlx::query_as(
                    "SELECT t.*, EXISTS (SELECT 1 FROM orders o WHERE o.tenant = $2 AND o.order_no = $3) AS order_exists \
                     FROM idempotency_tokens t WHERE t.token = $1",
                )
                .bind(token)
                .bind(tenant)
                .bind(order_no)
                .fetch_optional(self.pool())
                .await?;
                Ok(found.map(|f| (f.token, f.order_exists)))
            }

            async fn payment(&self, tenant: &str, request_no: &str) -> Result<Option<PaymentRecord>, sqlx::Error> {
                sqlx::query_as("SELECT * FROM payments WHERE tenant = $1 AND request_no = $2")
                    .bind(tenant)
                    .bind(request_no)
                    .fetch_optional(self.pool())
                    .await
            }

            async fn all_orders(&self) -> Result<Vec<Order>, sqlx::Error> {
                sqlx::query_as("SELECT * FROM orders ORDER BY tenant, order_no").fetch_all(self.pool()).await
            }

            async fn all_payments(&self) -> Result<Vec<PaymentRecord>, sqlx::Error> {
                sqlx::query_as("SELECT * FROM payments ORDER BY tenant, request_no").fetch_all(self.pool()).await
            }
        }
    };
}

impl_payment_store!(PgStore, const STATEMENT_PHASES: Option<PhaseDialect> = Some(PhaseDialect::Postgres););
impl_payment_store!(SqliteStore, const STATEMENT_PHASES: Option<PhaseDialect> = Some(PhaseDialect::Sqlite););
