//! The `http/…` scenarios: payments to an `onceflow serve` process (started next to this binary, with the mock
//! channel), and the storm of concurrent requests under one token.

use std::time::{Duration, Instant};

use onceflow_tests::baseline::fresh_db;

use super::measure::{Run, drive};
use super::options::Options;
use super::seed::seed_pg;

pub(crate) struct Server {
    child: std::process::Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `http://127.0.0.1:<port>`.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The CPU time the server has used so far (user and system, all threads), from `/proc/<pid>/stat`, whose
    /// fields 14 and 15 count clock ticks of `USER_HZ`, 100 a second on Linux.
    fn cpu(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(Duration::from_millis(ticks * 10))
    }

    fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
    }
}

/// Starts `onceflow serve` on `database_url` and waits until it answers `/healthz`.
pub(crate) async fn serve(database_url: &str) -> anyhow::Result<Server> {
    serve_with(database_url, &[]).await
}

/// [`serve`], with `extra` arguments after the usual ones (`--channel-notify-secrets …`).
pub(crate) async fn serve_with(database_url: &str, extra: &[&str]) -> anyhow::Result<Server> {
    let exe = std::env::current_exe()?.with_file_name("onceflow");
    anyhow::ensure!(exe.exists(), "{} not found: run `cargo build --release --workspace` first", exe.display());
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = std::process::Command::new(exe)
        .args([
            "serve",
            "--database-url",
            database_url,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--channel-url",
            "mock",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let server = Server { child, base: format!("http://127.0.0.1:{port}") };
    let started = Instant::now();
    while reqwest::get(format!("{}/healthz", server.base)).await.is_err() {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(server)
}

/// [`serve_with`] on a fresh Postgres database `name` of `base`'s server, seeded for `o.count` payments; with the
/// database's URL. The `…/postgres` scenarios that compare one server's flags with another's start both so.
pub(crate) async fn serve_seeded(
    base: &str,
    name: &str,
    o: &Options,
    extra: &[&str],
) -> anyhow::Result<(Server, String)> {
    let url = fresh_db(base, name)?;
    let server = serve_with(&url, extra).await?;
    seed_pg(&url, o.count).await?;
    Ok((server, url))
}

/// Drives `o.count` payments through the server, `o.concurrency` at a time; with the server's peak RSS.
pub(crate) async fn run(name: &'static str, server: &Server, o: &Options) -> anyhow::Result<Run> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(usize::try_from(o.concurrency)?).build()?;
    let base = server.base.clone();
    let cpu_before = server.cpu();
    let mut run = drive(name, o, move |n| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let r = client
                .post(format!("{base}/v1/payments"))
                .header("idempotency-key", format!("tok{n}"))
                .json(&serde_json::json!({"order_no": format!("o{n}"), "amount": 1000, "currency": "CNY"}))
                .send()
                .await?;
            anyhow::ensure!(r.status() == 201, "payment {n}: {}", r.status());
            Ok(())
        }
    })
    .await?;
    run.rss_kib = server.peak_rss_kib();
    // The server's own work per payment, whatever the client and the database took.
    if let (Some(before), Some(after)) = (cpu_before, server.cpu()) {
        let us = after.saturating_sub(before).as_secs_f64() * 1e6 / run.done.max(1) as f64;
        println!("  {name}: serve used {us:.0} µs of CPU per payment");
    }
    Ok(run)
}

async fn channel_calls(base: &str) -> anyhow::Result<f64> {
    let text = reqwest::get(format!("{base}/metrics")).await?.text().await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("onceflow_channel_calls_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// `storm` concurrent requests with one token: one charge, every answer identical.
pub(crate) async fn storm(server: &Server, o: &Options) -> anyhow::Result<(Duration, usize)> {
    let client = reqwest::Client::new();
    let base = &server.base;
    let order = serde_json::json!({"order_no": "storm", "amount": 1000, "currency": "CNY"});
    client.post(format!("{base}/v1/orders")).json(&order).send().await?;
    let token: serde_json::Value = client.post(format!("{base}/v1/tokens")).send().await?.json().await?;
    let token = token["token"].as_str().unwrap_or_default().to_owned();
    let calls_before = channel_calls(base).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..o.storm {
        let (client, base, token, order) = (client.clone(), base.clone(), token.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let r =
                client.post(format!("{base}/v1/payments")).header("idempotency-key", token).json(&order).send().await?;
            Ok::<_, anyhow::Error>((r.status().as_u16(), r.text().await?))
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await??);
    }
    let elapsed = started.elapsed();
    anyhow::ensure!(answers.iter().all(|a| a.0 == 201 && a.1 == answers[0].1), "storm answers differ");
    let charges = channel_calls(base).await? - calls_before;
    Ok((elapsed, charges as usize))
}
