//! The `onceflow` binary: parses the command line, sets up logs (and traces) and runs the command.

use std::process::ExitCode;

use clap::Parser;
use onceflow_api::config::Cli;

/// The stack of every thread (`RUST_MIN_STACK`, unless set): AMQP's header tables nest, and the AMQP client
/// parses and drops them recursively on its own thread — a message of a few kilobytes nested 300 deep overflowed
/// the default 2 MiB and aborted `consume`, again at every restart. 256 MiB covers the deepest table a 128 KiB
/// frame can hold; it is address space, taken only as deep as a thread goes.
const THREAD_STACK: usize = 256 * 1024 * 1024;

fn main() -> ExitCode {
    // The client's thread takes the standard library's default stack, which only the environment sets, and only
    // before the first thread starts: so the process starts itself again with it set (the same process, by exec).
    if std::env::var_os("RUST_MIN_STACK").is_none()
        && let Ok(exe) = std::env::current_exe()
    {
        use std::os::unix::process::CommandExt;
        let e = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("RUST_MIN_STACK", THREAD_STACK.to_string())
            .exec();
        eprintln!("onceflow: cannot set the thread stack ({e}); going on with the default");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().thread_stack_size(THREAD_STACK).build();
    match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("onceflow: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    let endpoint = cli.otlp_endpoint.clone().or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok());
    let telemetry = onceflow_api::telemetry::init(cli.log_format, endpoint.as_deref());
    let code = onceflow_api::run(cli.command).await;
    // Flushes the last spans (on a blocking thread: the exporter posts with a blocking client).
    let _ = tokio::task::spawn_blocking(move || drop(telemetry)).await;
    code
}
