//! The `onceflow` binary: parses the command line, sets up logging and runs the command.

use std::process::ExitCode;

use clap::Parser;
use onceflow_api::config::{Cli, LogFormat};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    // Colours only for a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    onceflow_api::run(cli.command).await
}
