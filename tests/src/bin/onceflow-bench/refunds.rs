//! `refunds/postgres`: refunds through the service as a library on Postgres, beside `library/postgres`'s
//! payments in the same run. The payments they refund are paid first, unmeasured; then each is refunded whole
//! under a token of its own (the refund saga's two commits, the order `paid → refunded`).

use std::time::Duration;

use onceflow_engine::{PgStore, Store};
use onceflow_payments::{NewRefund, PaymentStore, RequestNo, Token};
use onceflow_tests::baseline::{checkpoint, fresh_db};
use onceflow_tests::ids::pay_request;

use super::library::{commit_slots, service};
use super::measure::{Run, drive};
use super::options::Options;
use super::seed::seed_pg;

/// `count` unused refund tokens `rtok1..`, beside the seeded payment tokens.
const REFUND_TOKENS: &str = "INSERT INTO idempotency_tokens (token, tenant, state, created_at, expires_at, updated_at) \
     SELECT 'rtok' || g, 'default', 'issued', 0, 9000000000000, 0 FROM generate_series(1, $1) g";

/// Pays every seeded order (`r<n>`, unmeasured), then measures refunding each whole.
pub(crate) async fn postgres(base: &str, pool_size: u32, o: &Options) -> anyhow::Result<Run> {
    let url = fresh_db(base, "onceflow_bench_refunds")?;
    let store = PgStore::connect(&url, pool_size).await?.group_commit(commit_slots()?);
    store.migrate_payments().await?;
    seed_pg(&url, o.count).await?;
    sqlx::query(REFUND_TOKENS).bind(i64::try_from(o.count)?).execute(store.pool()).await?;
    let payments = service(store.clone());
    let paying = payments.clone();
    eprintln!("  refunds/postgres: paying {} orders first (not measured)", o.count);
    let unmeasured = Options { duration: Duration::from_secs(3600), ..o.clone() };
    drive("refunds/postgres (paying)", &unmeasured, move |n| {
        let payments = paying.clone();
        async move {
            let request = pay_request(format!("o{n}"), 1000, Some(&format!("r{n}")));
            let paid =
                payments.pay("default", &Token::parse(format!("tok{n}"))?, "/v1/payments", &request, WAIT).await?;
            anyhow::ensure!(paid.status == 201, "payment {n}: {} {}", paid.status, paid.body);
            Ok(())
        }
    })
    .await?;
    sqlx::query("VACUUM ANALYZE").execute(store.pool()).await?;
    checkpoint(&url)?;
    drive("refunds/postgres", o, move |n| {
        let payments = payments.clone();
        async move {
            let (token, request_no) = (Token::parse(format!("rtok{n}"))?, RequestNo::parse(format!("r{n}"))?);
            let refund = NewRefund::new(1000, None, None)?;
            let r = payments.refund("default", &token, &request_no, &refund, WAIT).await?;
            anyhow::ensure!(r.status == 201, "refund {n}: {} {}", r.status, r.body);
            Ok(())
        }
    })
    .await
}

const WAIT: Duration = Duration::from_secs(30);
