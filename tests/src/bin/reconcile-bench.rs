//! `reconcile-bench`: statement lines reconciled per second, and the peak RSS of `onceflow reconcile`, for days
//! of 100,000 and 1,000,000 lines on Postgres (a fresh database from `DATABASE_URL`). The statement is served
//! by this process, generated line by line as it is sent; every line matches a seeded payment (the usual day),
//! so each run reads the whole statement, every payment of the day, and writes no exception. The peak RSS of
//! the `onceflow` process must not grow with the day's length: the statement is streamed into the database and
//! matched in batches.
//!
//! ```sh
//! cargo build --release -p onceflow-api -p onceflow-tests
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres target/release/reconcile-bench [--lines 100000,1000000]
//! ```

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::routing::get;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut sizes = vec![100_000u64, 1_000_000];
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--lines") {
        sizes = args.get(i + 1).map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect()).unwrap_or_default();
    }
    let exe = std::env::current_exe()?.with_file_name("onceflow");
    anyhow::ensure!(exe.exists(), "build onceflow first (cargo build --release -p onceflow-api): {}", exe.display());
    println!("| statement lines | seconds | lines/s | peak RSS of onceflow reconcile |");
    println!("|---|---|---|---|");
    for lines in sizes {
        let url = onceflow_tests::pg_url().await?.ok_or_else(|| anyhow::anyhow!("DATABASE_URL is not set"))?;
        let day = chrono::Utc::now().date_naive() - chrono::Duration::days(2);
        seed(&url, lines, day).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let channel = format!("http://{}", listener.local_addr()?);
        let app = axum::Router::new().route("/v1/statements/{date}", get(statement)).with_state((lines, day));
        let server = tokio::spawn(axum::serve(listener, app).into_future());
        let started = Instant::now();
        let mut child = Command::new(&exe)
            .args(["reconcile", "--date", &day.to_string(), "--database-url", &url, "--channel-url", &channel])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()?;
        let mut peak_kib = 0u64;
        let status = loop {
            if let Ok(text) = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
                && let Some(kib) = text
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            {
                peak_kib = peak_kib.max(kib);
            }
            if let Some(status) = child.try_wait()? {
                break status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let seconds = started.elapsed().as_secs_f64();
        let mut out = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().expect("piped"), &mut out)?;
        anyhow::ensure!(status.success(), "onceflow reconcile failed");
        anyhow::ensure!(out.contains(&format!("matched             {lines}")), "not every line matched:\n{out}");
        server.abort();
        #[allow(clippy::cast_precision_loss)]
        let rate = lines as f64 / seconds;
        println!("| {lines} | {seconds:.1} | {rate:.0} | {:.1} MiB |", peak_kib as f64 / 1024.0);
    }
    Ok(())
}

/// `lines` payments of tenant `default`, succeeded on `day`, numbered as the statement numbers its lines.
async fn seed(url: &str, lines: u64, day: chrono::NaiveDate) -> anyhow::Result<()> {
    let pool = sqlx::PgPool::connect(url).await?;
    let noon = day.and_hms_opt(12, 0, 0).expect("noon").and_utc().timestamp_millis();
    sqlx::query(
        "INSERT INTO payments (tenant, request_no, order_no, amount, currency, status, token, charge_id, \
         created_at, updated_at) SELECT 'default', 'B-' || lpad(i::text, 8, '0'), 'O-' || i, 1000, 'CNY', \
         'succeeded', 'tok_' || i, 'ch_' || i, $1, $1 FROM generate_series(0, $2 - 1) i",
    )
    .bind(noon)
    .bind(i64::try_from(lines)?)
    .execute(&pool)
    .await?;
    sqlx::query("VACUUM ANALYZE payments").execute(&pool).await?;
    pool.close().await;
    Ok(())
}

/// The statement: on the benchmark's day, `lines` succeeded charges generated as they are sent; other days
/// (its neighbours) empty; all complete.
async fn statement(
    State((lines, day)): State<(u64, chrono::NaiveDate)>,
    Path(date): Path<String>,
) -> impl IntoResponse {
    let n = if date == day.to_string() { lines } else { 0 };
    let settled = day.and_hms_opt(8, 0, 0).expect("eight").and_utc().to_rfc3339();
    let chunks = futures_util::stream::unfold(0u64, move |from| {
        let settled = settled.clone();
        async move {
            if from >= n {
                return None;
            }
            let to = (from + 1000).min(n);
            let mut chunk = String::new();
            for i in from..to {
                chunk.push_str(&format!(
                    "{{\"kind\":\"charge\",\"merchant_request_no\":\"B-{i:08}\",\"charge_id\":\"ch_{i}\",\"order_no\":\"O-{i}\",\
                     \"amount\":1000,\"currency\":\"CNY\",\"status\":\"succeeded\",\"settled_at\":\"{settled}\"}}\n"
                ));
            }
            Some((Ok::<_, std::convert::Infallible>(chunk), to))
        }
    });
    ([("content-type", "application/x-ndjson"), ("statement-complete", "true")], axum::body::Body::from_stream(chunks))
}
