//! `benches/sqlite_floor.py`, the SQLite floor the README quotes, writes onceflow's own tables through its
//! migrations: a migration that changes them must change the script too. Here it runs a few payments in both of
//! its forms. Skipped (with a line on stderr) where there is no `python3`.

use std::process::Command;

#[test]
fn the_sqlite_floor_script_runs_on_the_current_schema() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/sqlite_floor.py");
    for per_commit in ["1", "4"] {
        let out = match Command::new("python3").args([script, "--count", "40", "--per-commit", per_commit]).output() {
            Ok(out) => out,
            Err(e) => return eprintln!("skipped: python3 not runnable ({e})"),
        };
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{printed}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(printed.contains("payments/s"), "{printed}");
    }
}
