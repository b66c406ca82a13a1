//! The Prometheus recorder: installed once per process, rendered by `GET /metrics`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the recorder (first call only).
pub fn install() {
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Suffix("duration_seconds".into()),
                &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0],
            )
            .ok()
            .and_then(|b| b.install_recorder().ok())
            .inspect(|_| describe())
    });
}

/// The metrics in Prometheus text format.
pub fn render() -> String {
    install();
    HANDLE.get().and_then(Option::as_ref).map(PrometheusHandle::render).unwrap_or_default()
}

fn describe() {
    ::metrics::describe_gauge!(
        "onceflow_unresolved_payments",
        "Payments whose charge outcome is still unknown or processing (retried, never auto-failed)"
    );
    ::metrics::describe_gauge!(
        "onceflow_unresolved_payment_oldest_seconds",
        ::metrics::Unit::Seconds,
        "Age of the oldest unresolved payment (0 when there is none)"
    );
    ::metrics::describe_gauge!(
        "onceflow_unresolved_refunds",
        "Refunds asked of the channel whose outcome is still unknown or processing (asked again, never guessed)"
    );
    ::metrics::describe_gauge!(
        "onceflow_unresolved_refund_oldest_seconds",
        ::metrics::Unit::Seconds,
        "Age of the oldest unresolved refund (0 when there is none)"
    );
    ::metrics::describe_counter!(
        "onceflow_refunds_total",
        "Merchant refunds by how they ended (succeeded, failed, exceeds, not_refundable, refund_no_conflict)"
    );
    ::metrics::describe_counter!(
        "onceflow_gc_deleted_total",
        "Rows deleted by this process's retention passes, by kind (unused_tokens, used_tokens, workflows, steps)"
    );
    ::metrics::describe_counter!(
        "onceflow_webhook_deliveries_total",
        "Webhook attempts made by this process, by outcome (delivered, retry, failed: the schedule is spent, gone: 410)"
    );
    ::metrics::describe_gauge!(
        "onceflow_webhook_pending",
        "Webhook deliveries pending (due, waiting for a retry, or in flight), as this process last counted (every 5 s)"
    );
    ::metrics::describe_gauge!(
        "onceflow_webhook_oldest_pending_seconds",
        ::metrics::Unit::Seconds,
        "Age of the oldest pending webhook delivery (0 when there is none)"
    );
    ::metrics::describe_gauge!(
        "onceflow_event_dispatch_lag_seconds",
        ::metrics::Unit::Seconds,
        "Age of the oldest event not yet dispatched to webhooks, committed or held back by an older transaction \
         (0 when there is none), as this process last measured (every 5 s)"
    );
    ::metrics::describe_gauge!(
        "onceflow_gc_last_run_timestamp_seconds",
        ::metrics::Unit::Seconds,
        "When this process last finished a retention pass (Unix time; passes run in one process at a time)"
    );
    ::metrics::describe_gauge!(
        "onceflow_reconciliation_exceptions",
        "Exceptions of the last reconciliation of a day, by tenant and class (every class but matched)"
    );
    ::metrics::describe_gauge!(
        "onceflow_reconciliation_last_run_timestamp_seconds",
        ::metrics::Unit::Seconds,
        "When this process last ran a reconciliation (Unix time; one process at a time runs one)"
    );
    ::metrics::describe_counter!(
        "onceflow_channel_notifications_total",
        "Channel notifications taken, by outcome (recorded, duplicate, unverified, invalid)"
    );
}
