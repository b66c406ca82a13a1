//! `onceflow workflows list | show | retry | cancel`: what an operator sees over HTTP (`GET /v1/workflows/{id}`:
//! the same fields, built by the same types — RFC 3339 times, input, output and errors as JSON, no token),
//! printed for people.

use onceflow_engine::WorkflowView;
use onceflow_payments::{PaymentStore, Payments};
use serde_json::Value;

use crate::config::WorkflowsCommand;
use crate::database::OnPayments;
use crate::routes::views::WorkflowDetail;

/// A `workflows` command, on the engine once it is connected.
pub(crate) struct Operate(pub(crate) WorkflowsCommand);

impl OnPayments for Operate {
    type Output = onceflow_engine::Result<()>;

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
        let engine = payments.engine();
        match self.0 {
            WorkflowsCommand::List { state, tenant, limit, .. } => {
                let filter =
                    onceflow_engine::store::WorkflowFilter { state, tenant: tenant.as_deref(), ..Default::default() };
                let page = engine.list(filter, limit).await?;
                println!("{:<48} {:<10} {:<20} {:>5}  UPDATED", "WORKFLOW", "NAME", "STATE", "EPOCH");
                for w in &page {
                    let updated = crate::routes::orders::rfc3339(w.updated_at);
                    println!("{:<48} {:<10} {:<20} {:>5}  {updated}", w.workflow_id, w.name, w.state, w.lease_epoch);
                }
                println!("({} shown)", page.len());
            }
            WorkflowsCommand::Show { workflow_id, .. } => {
                let view = engine.workflow(&workflow_id).await?.ok_or(onceflow_engine::Error::NotFound(workflow_id))?;
                print!("{}", shown(view));
            }
            WorkflowsCommand::Retry { workflow_id, .. } => {
                println!("{workflow_id} is now {}", engine.retry(&workflow_id).await?.state);
            }
            WorkflowsCommand::Cancel { workflow_id, .. } => {
                println!("{workflow_id} is now {}", engine.cancel(&workflow_id).await?.state);
            }
        }
        Ok(())
    }
}

/// A JSON value indented under a heading, or nothing when it is null.
fn block(out: &mut String, heading: &str, value: &Value) {
    if value.is_null() {
        return;
    }
    let pretty = serde_json::to_string_pretty(value).unwrap_or_default();
    out.push_str(&format!("{heading}\n"));
    for line in pretty.lines() {
        out.push_str(&format!("  {line}\n"));
    }
}

/// `workflows show`: the workflow's fields, what it waits for (while it does), its input, output and error, its
/// steps (each with its output or error) and its compensations.
fn shown(view: WorkflowView) -> String {
    let WorkflowDetail { workflow: w, steps, compensations, waiting_for } = view.into();
    let mut out = String::new();
    for (label, value) in [
        ("workflow", Some(w.workflow_id)),
        ("name", Some(w.name)),
        ("state", Some(w.state.to_string())),
        ("epoch", Some(w.lease_epoch.to_string())),
        ("created", Some(w.created_at)),
        ("updated", Some(w.updated_at)),
        ("next try", Some(w.next_attempt_at)),
        ("lease to", w.lease_expires_at),
    ] {
        if let Some(value) = value {
            out.push_str(&format!("{label:<10}{value}\n"));
        }
    }
    if let Some(wait) = waiting_for {
        out.push_str(&format!(
            "\nwaiting for {} ({}, {} attempts since {}; next try {}, or now with query-channel)\n  {}\n",
            wait.step_key, wait.status, wait.attempts, wait.since, wait.next_attempt_at, wait.reason
        ));
    }
    for (key, value) in [("input", &w.input), ("output", &w.output), ("error", &w.error)] {
        block(&mut out, &format!("\n{key}"), value);
    }
    out.push_str(&format!(
        "\n{:<36} {:<14} {:<10} {:>8}  {:<24}  FINISHED\n",
        "STEP", "KIND", "STATUS", "ATTEMPTS", "STARTED"
    ));
    for s in steps {
        out.push_str(&format!(
            "{:<36} {:<14} {:<10} {:>8}  {:<24}  {}\n",
            s.step_key,
            s.kind,
            s.status,
            s.attempts,
            s.started_at,
            s.finished_at.unwrap_or_default()
        ));
        for (key, value) in [("output", &s.output), ("error", &s.error)] {
            if !value.is_null() {
                out.push_str(&format!("    {key:<7}{value}\n"));
            }
        }
    }
    if !compensations.is_empty() {
        out.push_str(&format!("\n{:>4} {:<36} {:<16} STATUS\n", "SEQ", "STEP", "COMPENSATION"));
        for c in compensations {
            out.push_str(&format!("{:>4} {:<36} {:<16} {}\n", c.seq, c.step_key, c.name, c.status));
        }
    }
    out
}
