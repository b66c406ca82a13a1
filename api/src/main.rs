//! The `onceflow` binary. This first cut carries the commands the engine alone supports (`migrate`,
//! `workflows list|show|retry|cancel`); `serve`, `worker` and `mock-channel` arrive with the HTTP API.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use onceflow_engine::{Engine, PgStore, SqliteStore, Store};

#[derive(Parser)]
#[command(name = "onceflow", version, about = "Durable saga engine and payment service")]
struct Cli {
    /// `postgres://…` or `sqlite://…` (created if missing).
    #[arg(long, env = "ONCEFLOW_DATABASE_URL", default_value = "sqlite://onceflow.db", global = true)]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply the migrations and exit.
    Migrate,
    /// Inspect and steer workflows.
    #[command(subcommand)]
    Workflows(Workflows),
}

#[derive(Subcommand)]
enum Workflows {
    /// The newest workflows, optionally in one state.
    List {
        /// running, compensating, completed, failed, compensation_failed or cancelled.
        #[arg(long)]
        state: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// One workflow with its steps.
    Show {
        /// The workflow id.
        workflow_id: String,
    },
    /// Retry a workflow that ended failed or compensation_failed.
    Retry {
        /// The workflow id.
        workflow_id: String,
    },
    /// Cancel a running workflow: its compensations run.
    Cancel {
        /// The workflow id.
        workflow_id: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = if cli.database_url.starts_with("postgres") {
        match PgStore::connect(&cli.database_url, 4).await {
            Ok(store) => run(store, cli.command).await,
            Err(e) => Err(e.into()),
        }
    } else if cli.database_url.starts_with("sqlite:") {
        match SqliteStore::connect(&cli.database_url).await {
            Ok(store) => run(store, cli.command).await,
            Err(e) => Err(e.into()),
        }
    } else {
        eprintln!("error: --database-url must start with postgres:// or sqlite://");
        return ExitCode::from(2);
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run<S: Store>(store: S, command: Command) -> anyhow::Result<()> {
    store.migrate().await?;
    let engine = Engine::builder(store).build();
    match command {
        Command::Migrate => println!("migrations applied"),
        Command::Workflows(Workflows::List { state, limit }) => {
            println!("{:<40} {:<20} {:<20} {:>6}", "WORKFLOW", "NAME", "STATE", "EPOCH");
            for w in engine.list(state.as_deref(), None, limit).await? {
                println!("{:<40} {:<20} {:<20} {:>6}", w.workflow_id, w.name, w.state, w.lease_epoch);
            }
        }
        Command::Workflows(Workflows::Show { workflow_id }) => {
            let view =
                engine.workflow(&workflow_id).await?.ok_or_else(|| anyhow::anyhow!("no workflow {workflow_id}"))?;
            let w = &view.workflow;
            println!("workflow {}  name {}  state {}  epoch {}", w.workflow_id, w.name, w.state, w.lease_epoch);
            if let Some(error) = &w.error {
                println!("error {error}");
            }
            println!("{:<32} {:<14} {:<10} {:>8}", "STEP", "KIND", "STATUS", "ATTEMPTS");
            for s in &view.steps {
                println!("{:<32} {:<14} {:<10} {:>8}", s.step_key, s.kind, s.status, s.attempts);
            }
        }
        Command::Workflows(Workflows::Retry { workflow_id }) => {
            println!("{} is now {}", workflow_id, engine.retry(&workflow_id).await?.state);
        }
        Command::Workflows(Workflows::Cancel { workflow_id }) => {
            println!("{} is now {}", workflow_id, engine.cancel(&workflow_id).await?.state);
        }
    }
    Ok(())
}
