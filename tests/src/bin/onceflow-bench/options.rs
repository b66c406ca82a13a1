//! The command line: how many payments, how many at a time, which scenarios.

use std::time::Duration;

#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) concurrency: u64,
    pub(crate) count: u64,
    pub(crate) duration: Duration,
    pub(crate) storm: u64,
    /// Run only the scenarios whose name starts with this (`library`, `http/sqlite`, …; several: comma-separated);
    /// the baselines always run.
    pub(crate) only: Option<String>,
    /// Connections of the library scenarios' Postgres and MySQL pools (`serve` keeps its default).
    pub(crate) pool: Option<u32>,
    /// Times `floor_pay` and `library/postgres` run back to back, for the median of their paired ratios.
    pub(crate) rounds: u64,
    /// `library/postgres` runs a retention pass this often, and samples the database's size and the rate
    /// in and out of passes (`0s`: samples only, no passes).
    pub(crate) gc_every: Option<Duration>,
    /// The history retention of those passes.
    pub(crate) history_retention: Duration,
    /// A plain `VACUUM` of the tables a pass deletes from after each pass: what autovacuum does where it is
    /// on, so that the deleted rows' space is reused (this machine's Postgres runs with `autovacuum = off`).
    pub(crate) vacuum: bool,
}

impl Options {
    pub(crate) fn wants(&self, scenario: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only.split(',').any(|p| scenario.starts_with(p)))
    }

    /// Whether `--only` names `scenario` (a scenario that a run of every scenario leaves out).
    pub(crate) fn asks(&self, scenario: &str) -> bool {
        self.only.is_some() && self.wants(scenario)
    }
}

/// The options of this process's arguments (`--help` prints them and exits).
pub(crate) fn parse() -> anyhow::Result<Options> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Options {
        concurrency: 16,
        count: 8000,
        duration: Duration::from_secs(60),
        storm: 1000,
        only: None,
        pool: None,
        rounds: 1,
        gc_every: None,
        history_retention: Duration::from_secs(30 * 86_400),
        vacuum: false,
    };
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match (args[i].as_str(), value) {
            ("--concurrency", Some(v)) => o.concurrency = v.max(1),
            ("--count", Some(v)) => o.count = v.max(1),
            ("--duration-secs", Some(v)) => o.duration = Duration::from_secs(v.max(1)),
            ("--storm", Some(v)) => o.storm = v.max(1),
            ("--only", _) if i + 1 < args.len() => o.only = Some(args[i + 1].clone()),
            ("--pool", Some(v)) => o.pool = Some(u32::try_from(v)?.max(2)),
            ("--rounds", Some(v)) => o.rounds = v.max(1),
            ("--gc-every", _) if i + 1 < args.len() => o.gc_every = Some(humantime::parse_duration(&args[i + 1])?),
            ("--history-retention", _) if i + 1 < args.len() => {
                o.history_retention = humantime::parse_duration(&args[i + 1])?;
            }
            ("--vacuum", _) => {
                o.vacuum = true;
                i += 1;
                continue;
            }
            ("--help" | "-h", _) => {
                println!(
                    "onceflow-bench [--concurrency 16] [--count 8000] [--duration-secs 60] [--storm 1000] \
                     [--only library|http|mq|refunds|notify|events|tracing|http/postgres,mq/postgres|…] [--pool CONNECTIONS] \
                     [--rounds 1] [--gc-every 10s [--history-retention 0s] [--vacuum]]"
                );
                std::process::exit(0);
            }
            (other, _) => anyhow::bail!("unknown or incomplete option {other} (see --help)"),
        }
        i += 2;
    }
    Ok(o)
}
