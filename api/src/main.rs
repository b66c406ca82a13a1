//! The `onceflow` binary: parses the command line, sets up logs (and traces) and runs the command.

use std::process::ExitCode;

use clap::Parser;
use onceflow_api::config::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let endpoint = cli.otlp_endpoint.clone().or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok());
    let telemetry = onceflow_api::telemetry::init(cli.log_format, endpoint.as_deref());
    let code = onceflow_api::run(cli.command).await;
    // Flushes the last spans (on a blocking thread: the exporter posts with a blocking client).
    let _ = tokio::task::spawn_blocking(move || drop(telemetry)).await;
    code
}
