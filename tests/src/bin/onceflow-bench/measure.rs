//! How a scenario is measured: `count` payments from `concurrency` tasks, each one's latency kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::options::Options;

/// What one scenario measured.
pub(crate) struct Run {
    pub(crate) name: &'static str,
    pub(crate) done: u64,
    pub(crate) secs: f64,
    pub(crate) latencies_us: Vec<u64>,
    pub(crate) rss_kib: Option<u64>,
}

impl Run {
    pub(crate) fn rate(&self) -> f64 {
        self.done as f64 / self.secs
    }

    pub(crate) fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        v[i] as f64 / 1000.0
    }
}

/// Drives `pay(n)` for n in 1..=count with `concurrency` tasks (stopping at `duration`), with a progress line.
pub(crate) async fn drive<F, Fut>(name: &'static str, o: &Options, pay: F) -> anyhow::Result<Run>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let pay = Arc::new(pay);
    let next = Arc::new(AtomicU64::new(1));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + o.duration;
    let mut tasks = Vec::new();
    for _ in 0..o.concurrency {
        let (pay, next, done, count) = (pay.clone(), next.clone(), done.clone(), o.count);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n > count || Instant::now() >= deadline {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let t = Instant::now();
                pay(n).await?;
                latencies.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let progress = {
        let done = done.clone();
        let count = o.count;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let n = done.load(Ordering::Relaxed);
                let rate = n as f64 / started.elapsed().as_secs_f64();
                eprintln!("  {name}: {n}/{count} payments, {rate:.0}/s");
            }
        })
    };
    let mut latencies_us = Vec::new();
    for t in tasks {
        latencies_us.extend(t.await??);
    }
    progress.abort();
    let secs = started.elapsed().as_secs_f64();
    Ok(Run { name, done: done.load(Ordering::Relaxed), secs, latencies_us, rss_kib: None })
}
