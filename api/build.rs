//! Marks the tests that need a database server, a broker, schemathesis or the standardwebhooks package as ignored when its URL (or path) is
//! not set at build time, so that a tally counts them as ignored rather than passed (they would return at once).
//! `.ci/run` sets every variable, so CI runs them all; cargo rebuilds when one of the variables changes. The
//! console's browser tests are ignored likewise when no chromedriver is found (`CHROMEDRIVER`, else on `PATH`).
fn main() {
    println!("cargo::rerun-if-env-changed=CHROMEDRIVER");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rustc-check-cfg=cfg(onceflow_no_chromedriver)");
    let driver = std::env::var_os("CHROMEDRIVER").map(std::path::PathBuf::from).or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join("chromedriver")).find(|p| p.is_file())
    });
    if !driver.is_some_and(|p| p.is_file()) {
        println!("cargo::rustc-cfg=onceflow_no_chromedriver");
    }
    for (var, cfg) in [
        ("DATABASE_URL", "onceflow_no_postgres"),
        ("MYSQL_URL", "onceflow_no_mysql"),
        ("AMQP_URL", "onceflow_no_amqp"),
        ("SCHEMATHESIS", "onceflow_no_schemathesis"),
        ("STANDARDWEBHOOKS_PYTHON", "onceflow_no_standardwebhooks"),
    ] {
        println!("cargo::rerun-if-env-changed={var}");
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if std::env::var(var).map_or(true, |v| v.is_empty()) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
