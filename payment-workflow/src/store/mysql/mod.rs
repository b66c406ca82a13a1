//! The payment tables' queries on MySQL / MariaDB: `?` parameters, bound in the order they appear, and a
//! duplicate key read as "exists" (MySQL rolls back only the failed statement, the step's transaction goes on).

use onceflow_engine::{Conn, MySqlStore, Store};

use super::{PaymentStore, Reserve, Sql, TokenCheck};
use crate::model::{Order, PaymentRecord, TokenRecord};

/// `Ok(false)` for a duplicate key, `Ok(true)` for an insert.
fn inserted(result: Result<sqlx::mysql::MySqlQueryResult, sqlx::Error>) -> Result<bool, sqlx::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(false),
        Err(e) => Err(e),
    }
}

impl PaymentStore for MySqlStore {
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
        })
    }

    fn insert_payment<'c>(conn: &'c mut Conn<Self>, p: PaymentRecord) -> Sql<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "INSERT INTO payments (tenant, request_no, order_no, amount, currency, status, token, charge_id, \
                 decline_code, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            .await;
            Ok(inserted(done)?)
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
            let found: Option<(i64, String)> =
                sqlx::query_as("SELECT amount, currency FROM orders WHERE tenant = ? AND order_no = ?")
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
                "UPDATE payments SET status = ?, charge_id = COALESCE(?, charge_id), \
                 decline_code = COALESCE(?, decline_code), updated_at = ? \
                 WHERE tenant = ? AND request_no = ? AND token = ? AND status = 'processing'",
            )
            .bind(status)
            .bind(charge_id)
            .bind(decline_code)
            .bind(now)
            .bind(tenant)
            .bind(request_no)
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
        })
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
        .bind(&o.status)
        .bind(o.version)
        .bind(o.created_at)
        .bind(o.updated_at)
        .execute(self.write_pool())
        .await;
        inserted(done)
    }

    async fn order(&self, tenant: &str, order_no: &str) -> Result<Option<Order>, sqlx::Error> {
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
        .bind(&t.state)
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
        let done = sqlx::query(
            "INSERT INTO idempotency_tokens (token, tenant, state, fingerprint, route, response_status, \
             response_body, created_at, expires_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        .bind(t.updated_at)
        .execute(self.write_pool())
        .await;
        // A duplicate key is the token of an earlier delivery: caught, not `INSERT IGNORE`, which would also
        // turn other errors into warnings.
        if inserted(done)? {
            return Ok(());
        }
        sqlx::query(
            "UPDATE idempotency_tokens SET expires_at = ?, updated_at = ? \
             WHERE token = ? AND state = 'issued' AND expires_at <= ?",
        )
        .bind(t.expires_at)
        .bind(t.updated_at)
        .bind(&t.token)
        .bind(t.created_at)
        .execute(self.write_pool())
        .await?;
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
        let done = sqlx::query(
            "UPDATE idempotency_tokens SET state = 'completed', fingerprint = ?, route = ?, response_status = ?, \
             response_body = ?, updated_at = ? WHERE token = ? AND state = 'issued'",
        )
        .bind(fingerprint)
        .bind(route)
        .bind(i32::from(response.status))
        .bind(&response.body)
        .bind(now)
        .bind(token)
        .execute(self.write_pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn token_and_order(
        &self,
        token: &str,
        tenant: &str,
        order_no: &str,
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

    async fn payment(&self, tenant: &str, request_no: &str) -> Result<Option<PaymentRecord>, sqlx::Error> {
        sqlx::query_as("SELECT * FROM payments WHERE tenant = ? AND request_no = ?")
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
