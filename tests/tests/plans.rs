//! Postgres keeps a connection's plan of a prepared statement: a generic plan made while a table was nearly
//! empty (a fresh database, or statistics taken while it was) scans the table whole, and keeps doing so as it
//! grows, unless something makes it plan again (autovacuum's `ANALYZE`, which a server may not run). The store
//! plans its held connections' statements again as they age; this test shows the payment path stops scanning
//! `payments` once it has.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::{EngineConfig, PgStore, Store};
use onceflow_payments::{MockChannel, MockChannelConfig, Payments};
use onceflow_tests::ids::{cny, order_no, pay_request};

const T: &str = "default";
const WAIT: Duration = Duration::from_secs(20);
/// Rows of another tenant put into `payments` once the first plans are made: a whole scan reads them all.
const FILLER: i64 = 20_000;

/// Pays `n` orders one after another (one held connection serves them all), numbered from `from`.
async fn pay(p: &Payments<PgStore>, from: usize, n: usize) {
    for i in from..from + n {
        let order = format!("O-{i}");
        p.create_order(T, &order_no(&order), 1000, &cny()).await.unwrap();
        let token = p.issue_token(T).await.unwrap().token;
        let r = p.pay(T, &token, "/v1/payments", &pay_request(&order, 1000, None), WAIT).await.unwrap();
        assert_eq!(r.status, 201, "{}", r.body);
    }
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test]
async fn a_plan_made_while_payments_was_empty_is_made_again() {
    let Some(url) = onceflow_tests::pg_url().await.unwrap() else { return };
    // Planned again half a second after a connection is taken, then a second later (by default: 10 s).
    let store = PgStore::connect(&url, 8).await.unwrap().replan_after(Duration::from_millis(500));
    // Statistics that say the payment tables are empty, as after a `VACUUM ANALYZE` of a fresh database.
    sqlx::query("VACUUM ANALYZE").execute(store.pool()).await.unwrap();
    let channel = MockChannel::new(MockChannelConfig::default());
    let p = Payments::new(store.clone(), Arc::new(channel), EngineConfig::default());
    // Past the sixth execution of each statement, Postgres keeps the generic plan, made on a near-empty table.
    pay(&p, 0, 12).await;
    sqlx::query(
        "INSERT INTO payments (tenant, request_no, order_no, amount, currency, status, token, created_at, \
         updated_at) SELECT 'filler', 'R-' || g, 'O-' || g, 1000, 'CNY', 'succeeded', 'filler-' || g, 0, 0 \
         FROM generate_series(1, $1) g",
    )
    .bind(FILLER)
    .execute(store.pool())
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pay(&p, 12, 20).await;
    // A backend sends its statistics when it ends: end the store's, then read them on a new connection.
    let admin = PgStore::connect(&url, 1).await.unwrap();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid()",
    )
    .execute(admin.pool())
    .await
    .unwrap();
    // Every backend's statistics are in once the inserts of all of them are: the filler and 32 payments.
    let (mut read, mut seen) = (0, 0);
    for _ in 0..100 {
        let (inserted, scanned) = sqlx::query_as::<_, (i64, i64)>(
            "SELECT n_tup_ins, coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relname = 'payments'",
        )
        .fetch_one(admin.pool())
        .await
        .unwrap();
        (read, seen) = (scanned, inserted);
        if inserted >= FILLER + 32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen >= FILLER + 32, "statistics not in: {seen} rows inserted");
    // The first twelve payments may scan the few rows there were; none of the last twenty the filler.
    assert!(read < FILLER, "the payment path scanned payments whole after it had grown: {read} rows read");
}
