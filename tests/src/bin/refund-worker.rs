//! A refund process for the crash tests: refunds one payment under one token through an HTTP channel, printing
//! `status <code>` and the body when it has the final answer.
//!
//! `refund-worker <database-url> <channel-url> <token> <request-no> <amount> <refund-no>`
//!
//! With `REFUND_WORKER_GATE` set, it prints `ready` once connected and migrated, and refunds only once a line
//! arrives on its standard input: so that a test can take a lock first, between the two.

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::{EngineConfig, MySqlStore, PgStore, SqliteStore};
use onceflow_payments::{HttpChannel, NewRefund, PaymentStore, Payments, RefundNo, RequestNo, Token};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, channel, token, request_no, amount, refund_no] = args.as_slice() else {
        anyhow::bail!("usage: refund-worker <database-url> <channel-url> <token> <request-no> <amount> <refund-no>");
    };
    let refund = NewRefund::new(amount.parse()?, Some(RefundNo::parse(refund_no.as_str())?), None)?;
    let (token, request_no) = (&Token::parse(token.as_str())?, &RequestNo::parse(request_no.as_str())?);
    if url.starts_with("postgres") {
        run(PgStore::connect(url, 4).await?, channel, token, request_no, &refund).await
    } else if url.starts_with("mysql") {
        run(MySqlStore::connect(url, 4).await?, channel, token, request_no, &refund).await
    } else {
        run(SqliteStore::connect(url).await?, channel, token, request_no, &refund).await
    }
}

async fn run<S: PaymentStore>(
    store: S,
    channel: &str,
    token: &Token,
    request_no: &RequestNo,
    refund: &NewRefund,
) -> anyhow::Result<()> {
    store.migrate_payments().await?;
    let channel = Arc::new(HttpChannel::new(channel, Duration::from_secs(10))?);
    let config = EngineConfig {
        lease: Duration::from_millis(500),
        poll_interval: Duration::from_millis(50),
        ..EngineConfig::default()
    };
    let payments = Payments::new(store, channel, config);
    let _background = payments.engine().spawn_background();
    if std::env::var_os("REFUND_WORKER_GATE").is_some() {
        println!("ready");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
    }
    let response = payments.refund("default", token, request_no, refund, Duration::from_secs(60)).await?;
    println!("status {}", response.status);
    println!("{}", response.body);
    payments.engine().shutdown(Duration::from_secs(1)).await?;
    Ok(())
}
