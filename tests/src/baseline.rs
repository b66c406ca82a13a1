//! The plain-SQL baselines of `../shared/bench/`, measured with `pgbench` on the same Postgres.

use std::path::PathBuf;
use std::process::Command;

/// Where `schema.sql` and the pgbench scripts are (`ONCEFLOW_BENCH_DIR`, else `../shared/bench`).
pub fn bench_dir() -> PathBuf {
    std::env::var_os("ONCEFLOW_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/bench"))
}

/// Runs a command, failing with its stderr.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output()?;
    anyhow::ensure!(out.status.success(), "{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A fresh database `name` next to `base`'s (dropped first if it exists); returns its URL.
///
/// `ONCEFLOW_BENCH_DB_SUFFIX`, when set, is appended to `name`: engineers benchmarking on one Postgres server
/// each give their own, so that no one's fresh database drops another's in the middle of a run.
pub fn fresh_db(base: &str, name: &str) -> anyhow::Result<String> {
    let name = format!("{name}{}", std::env::var("ONCEFLOW_BENCH_DB_SUFFIX").unwrap_or_default());
    anyhow::ensure!(
        name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
        "ONCEFLOW_BENCH_DB_SUFFIX may hold letters, digits and _ only"
    );
    let server = base.rsplit_once('/').map(|(s, _)| s).unwrap_or(base);
    run(Command::new("psql").args([base, "-qc", &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")]))?;
    run(Command::new("psql").args([base, "-qc", &format!("CREATE DATABASE {name}")]))?;
    Ok(format!("{server}/{name}"))
}

/// A `CHECKPOINT` before a measured run, so that every run starts the same: the pages it touches first after a
/// checkpoint are written to the WAL whole, and a checkpoint falling inside one run but not another would move
/// their ratio.
pub fn checkpoint(url: &str) -> anyhow::Result<()> {
    run(Command::new("psql").args([url, "-qc", "CHECKPOINT"]))?;
    Ok(())
}

/// Payments per second of `script` (`seed_pay.pgbench` or `floor_pay.pgbench`) with `clients` clients and
/// `transactions` each, on a fresh database with the baseline schema.
pub fn pgbench(base: &str, script: &str, clients: u64, transactions: u64) -> anyhow::Result<f64> {
    let schema = bench_dir().join("schema.sql");
    anyhow::ensure!(
        schema.exists() && bench_dir().join(script).exists(),
        "no baselines in {}: set ONCEFLOW_BENCH_DIR to the folder of schema.sql and {script}",
        bench_dir().display()
    );
    let name = format!("onceflow_bench_{}", script.trim_end_matches(".pgbench"));
    let url = fresh_db(base, &name)?;
    let n = clients * transactions;
    run(Command::new("psql").arg(&url).args(["-q", "-v", &format!("n={n}"), "-f"]).arg(schema))?;
    checkpoint(&url)?;
    let out = run(Command::new("pgbench")
        .args(["-n", "-c", &clients.to_string(), "-j", "2", "-t", &transactions.to_string(), "-f"])
        .arg(bench_dir().join(script))
        .arg(&url))?;
    out.lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no tps in pgbench output:\n{out}"))
}
