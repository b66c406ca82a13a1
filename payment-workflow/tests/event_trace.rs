//! An event carries the trace context of the span it is made in (issue 33, traces): its deliveries send it on as
//! `traceparent`, so a receiver's work joins the payment's trace. A test binary of its own: the trace hook is
//! installed once per process.

use onceflow_engine::trace::{TraceContext, set_trace_context};
use onceflow_payments::{EventType, NewEvent};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

struct Fixed;

impl TraceContext for Fixed {
    fn current(&self) -> Option<String> {
        Some(PARENT.to_owned())
    }

    fn adopt(&self, _span: &tracing::Span, _traceparent: &str) {}
}

#[test]
fn an_event_carries_the_trace_it_was_made_in() {
    set_trace_context(Fixed);
    let payment = NewEvent::payment("acme", "R-1", EventType::PaymentSucceeded, "{}".into(), 1);
    assert_eq!(payment.traceparent.as_deref(), Some(PARENT));
    let refund = NewEvent::refund("acme", "RF-1", EventType::RefundSucceeded, "{}".into(), 1);
    assert_eq!(refund.traceparent.as_deref(), Some(PARENT));
}
