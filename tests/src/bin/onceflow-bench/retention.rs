//! `library/postgres` with retention passes (`--gc-every 10s --history-retention 0s`): the database's size
//! (`pg_database_size`, sampled every second: its peak, and at the end) and the payment rate while a pass runs
//! and while none does, from the same run. `--gc-every 0s` samples the same without passes, for comparison;
//! `--vacuum` runs a plain `VACUUM` after each pass, as autovacuum would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use onceflow_engine::PgStore;
use onceflow_payments::{PassReport, Retention};

use super::library::{pay, service};
use super::measure::{Run, drive};
use super::options::Options;

/// How often the rate is sampled: an interval that overlaps a pass counts as "during a pass".
const SAMPLE: Duration = Duration::from_millis(100);

async fn size(pool: &sqlx::PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT pg_database_size(current_database())").fetch_one(pool).await?)
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub(crate) async fn run(store: PgStore, url: &str, every: Duration, o: &Options) -> anyhow::Result<Run> {
    let retention = Retention { history_retention: o.history_retention, ..Retention::default() };
    let payments = service(store).with_retention(retention);
    let probe = sqlx::PgPool::connect(url).await?;
    let start_size = size(&probe).await?;
    let done = Arc::new(AtomicU64::new(0));
    // Odd while a pass runs: incremented when one starts and when it ends.
    let passes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    let vacuum = o.vacuum;
    let gc = (!every.is_zero()).then(|| {
        let (payments, passes, stop, probe) = (payments.clone(), passes.clone(), stop.clone(), probe.clone());
        tokio::spawn(async move {
            let mut log: Vec<(Duration, PassReport)> = Vec::new();
            let mut vacuumed = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(every).await;
                passes.fetch_add(1, Ordering::SeqCst);
                let t = Instant::now();
                let report = payments.retention_pass(false).await;
                let took = t.elapsed();
                if vacuum {
                    let t = Instant::now();
                    let done = sqlx::query("VACUUM workflows, workflow_steps, idempotency_tokens").execute(&probe);
                    if let Err(e) = done.await {
                        eprintln!("  VACUUM failed: {e}");
                    }
                    vacuumed += t.elapsed();
                }
                passes.fetch_add(1, Ordering::SeqCst);
                match report {
                    Ok(Some(r)) => log.push((took, r)),
                    Ok(None) => eprintln!("  a pass was skipped: another process holds the lock"),
                    Err(e) => eprintln!("  a pass failed: {e}"),
                }
            }
            (log, vacuumed)
        })
    });
    let sampler = {
        let (done, passes, stop, probe) = (done.clone(), passes.clone(), stop.clone(), probe.clone());
        tokio::spawn(async move {
            let (mut during, mut outside) = ((0u64, Duration::ZERO), (0u64, Duration::ZERO));
            let mut peak = 0i64;
            let (mut last_done, mut last_epoch) = (0, 0);
            let mut last_size = Instant::now() - Duration::from_secs(1);
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(SAMPLE).await;
                let (now_done, epoch) = (done.load(Ordering::SeqCst), passes.load(Ordering::SeqCst));
                let slot = if last_epoch % 2 == 1 || epoch != last_epoch { &mut during } else { &mut outside };
                slot.0 += now_done - last_done;
                slot.1 += SAMPLE;
                (last_done, last_epoch) = (now_done, epoch);
                if last_size.elapsed() >= Duration::from_secs(1) {
                    last_size = Instant::now();
                    if let Ok(bytes) = size(&probe).await {
                        peak = peak.max(bytes);
                    }
                }
            }
            (during, outside, peak)
        })
    };

    let counted = done.clone();
    let run = drive("library/postgres", o, move |n| {
        let (payments, counted) = (payments.clone(), counted.clone());
        async move {
            pay(&payments, n).await?;
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    let (during, outside, peak) = sampler.await?;
    let (log, vacuumed) = match gc {
        Some(gc) => gc.await?,
        None => (Vec::new(), Duration::ZERO),
    };
    let end_size = size(&probe).await?;
    let rate = |(n, t): (u64, Duration)| if t.is_zero() { 0.0 } else { n as f64 / t.as_secs_f64() };
    let deleted: u64 = log.iter().map(|(_, r)| r.workflows).sum();
    let steps: u64 = log.iter().map(|(_, r)| r.steps).sum();
    let longest = log.iter().map(|(t, _)| *t).max().unwrap_or_default();
    let total: Duration = log.iter().map(|(t, _)| *t).sum();
    eprintln!(
        "library/postgres, passes every {} (history {}): {} passes, {:.1} s in passes (longest {} ms), \
         {deleted} workflows and {steps} steps deleted",
        humantime::format_duration(every),
        humantime::format_duration(o.history_retention),
        log.len(),
        total.as_secs_f64(),
        longest.as_millis(),
    );
    if vacuum {
        eprintln!(
            "  a plain VACUUM after each pass: {:.1} s in all (counted as during the passes)",
            vacuumed.as_secs_f64()
        );
    }
    eprintln!(
        "  payments/s: {:.0} overall, {:.0} during passes ({:.1} s sampled), {:.0} outside them ({:.1} s)",
        run.rate(),
        rate(during),
        during.1.as_secs_f64(),
        rate(outside),
        outside.1.as_secs_f64(),
    );
    eprintln!(
        "  pg_database_size: {:.0} MiB at the start (seeded), peak {:.0} MiB, {:.0} MiB at the end",
        mib(start_size),
        mib(peak.max(end_size)),
        mib(end_size),
    );
    Ok(run)
}
