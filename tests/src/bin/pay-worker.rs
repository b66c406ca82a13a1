//! A payment process for the crash tests: pays one order under one token through an HTTP channel, printing
//! `status <code>` and the body when it has the final answer.
//!
//! `pay-worker <database-url> <channel-url> <token> <order-no> <amount>`

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::{EngineConfig, MySqlStore, PgStore, SqliteStore};
use onceflow_payments::{HttpChannel, PaymentRequest, PaymentStore, Payments, Token};
use onceflow_tests::ids::{cny, order_no as order};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, channel, token, order_no, amount] = args.as_slice() else {
        anyhow::bail!("usage: pay-worker <database-url> <channel-url> <token> <order-no> <amount>");
    };
    let request = PaymentRequest::new(order(order_no.as_str()), amount.parse()?, cny(), None)?;
    let token = &Token::parse(token.as_str())?;
    if url.starts_with("postgres") {
        run(PgStore::connect(url, 4).await?, channel, token, &request).await
    } else if url.starts_with("mysql") {
        run(MySqlStore::connect(url, 4).await?, channel, token, &request).await
    } else {
        run(SqliteStore::connect(url).await?, channel, token, &request).await
    }
}

async fn run<S: PaymentStore>(store: S, channel: &str, token: &Token, request: &PaymentRequest) -> anyhow::Result<()> {
    store.migrate_payments().await?;
    let channel = Arc::new(HttpChannel::new(channel, Duration::from_secs(10))?);
    let config = EngineConfig {
        lease: Duration::from_millis(500),
        poll_interval: Duration::from_millis(50),
        ..EngineConfig::default()
    };
    let payments = Payments::new(store, channel, config);
    let _background = payments.engine().spawn_background();
    let response = payments.pay("default", token, "/v1/payments", request, Duration::from_secs(60)).await?;
    println!("status {}", response.status);
    println!("{}", response.body);
    payments.engine().shutdown(Duration::from_secs(1)).await?;
    Ok(())
}
