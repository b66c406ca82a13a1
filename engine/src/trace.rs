//! Trace context across processes: the engine stores the W3C `traceparent` of the span that started a workflow
//! with it, and makes every later run of it (in whichever process resumes it) a child of that context, so that
//! one payment is one trace. The engine knows `tracing` only: how a span's context is read and set is the
//! application's (the `onceflow` binary installs an OpenTelemetry hook when traces are exported); without a hook
//! nothing is stored and nothing is set.

use std::sync::OnceLock;

/// How the application reads and sets trace contexts on `tracing` spans.
pub trait TraceContext: Send + Sync + 'static {
    /// The W3C `traceparent` of the current span, if it is traced.
    fn current(&self) -> Option<String>;
    /// Makes `span` a child of the context `traceparent` (a W3C header value).
    fn adopt(&self, span: &tracing::Span, traceparent: &str);
}

static HOOK: OnceLock<Box<dyn TraceContext>> = OnceLock::new();

/// Installs the process's trace context hook (once; later calls change nothing).
pub fn set_trace_context(hook: impl TraceContext) {
    let _ = HOOK.set(Box::new(hook));
}

/// The `traceparent` of the current span: what a new workflow stores, and what a call to another service
/// (the channel, a webhook) carries onward. `None` without a hook or outside a traced span.
pub fn current() -> Option<String> {
    HOOK.get().and_then(|hook| hook.current())
}

/// Makes `span` a child of `traceparent`, if a hook is installed and a context is given.
pub fn adopt(span: &tracing::Span, traceparent: Option<&str>) {
    if let (Some(hook), Some(parent)) = (HOOK.get(), traceparent) {
        hook.adopt(span, parent);
    }
}
