//! Logs and traces of the `onceflow` binary: logs to stderr through `tracing` (`RUST_LOG` filters), and — only
//! when `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) is set — onceflow's spans exported over OTLP/HTTP
//! (protobuf) by the OpenTelemetry SDK's batch thread, with the engine's trace-context hook installed so that a
//! workflow carries its trace across processes and the channel call carries it onward. Without an endpoint
//! nothing of OpenTelemetry runs.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;

/// What must outlive the command: the trace exporter, flushed when dropped.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // Spans still batched are sent now (a killed process loses its last batch; the trace goes on from the
            // process that resumes its workflows).
            let _ = provider.shutdown();
        }
    }
}

/// The OTLP/HTTP traces URL of `endpoint`: the collector's base URL with `/v1/traces`, unless it names it.
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") { base.to_owned() } else { format!("{base}/v1/traces") }
}

/// Sets up logs (and traces, with an endpoint) for the whole process.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    // Colours only for a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let logs = match format {
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
        LogFormat::Text => logs.with_filter(filter).boxed(),
    };
    let endpoint = otlp_endpoint.filter(|e| !e.is_empty());
    let provider = endpoint.and_then(|endpoint| {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(traces_url(endpoint))
            .build()
            .map_err(|e| eprintln!("warning: traces are not exported: {e}"))
            .ok()?;
        let resource = opentelemetry_sdk::Resource::builder().with_service_name("onceflow").build();
        Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
    });
    let traces = provider.as_ref().map(|provider| {
        // onceflow's own spans (requests, workflow runs, steps, payments), not its libraries'.
        let ours = Targets::new()
            .with_target("onceflow_api", Level::INFO)
            .with_target("onceflow_engine", Level::INFO)
            .with_target("onceflow_payments", Level::INFO)
            .with_target("tower_http", Level::INFO);
        tracing_opentelemetry::layer().with_tracer(provider.tracer("onceflow")).with_filter(ours)
    });
    tracing_subscriber::registry().with(logs).with(traces).init();
    if provider.is_some() {
        onceflow_engine::trace::set_trace_context(W3c);
    }
    Telemetry { provider }
}

/// W3C Trace Context on `tracing` spans, through tracing-opentelemetry.
struct W3c;

impl onceflow_engine::trace::TraceContext for W3c {
    fn current(&self) -> Option<String> {
        let context = tracing::Span::current().context();
        let span = context.span();
        let sc = span.span_context();
        sc.is_valid().then(|| format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8()))
    }

    fn adopt(&self, span: &tracing::Span, traceparent: &str) {
        let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
        let parent = TraceContextPropagator::new().extract(&carrier);
        if parent.span().span_context().is_valid() {
            let _ = span.set_parent(parent);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_traces_url_is_the_collectors_with_its_path() {
        assert_eq!(super::traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(super::traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(super::traces_url("http://c:4318/v1/traces"), "http://c:4318/v1/traces");
    }
}
