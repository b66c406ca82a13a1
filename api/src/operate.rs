//! `onceflow workflows list | show | retry | cancel`: what an operator sees over HTTP (`GET /v1/workflows/{id}`:
//! the same fields, built by the same functions — RFC 3339 times, input, output and errors as JSON, no token),
//! printed for people.

use onceflow_engine::WorkflowView;
use onceflow_payments::{PaymentStore, Payments};
use serde_json::Value;

use crate::config::WorkflowsCommand;
use crate::database::OnPayments;
use crate::routes::ops::{redacted, step_view};

/// A `workflows` command, on the engine once it is connected.
pub(crate) struct Operate(pub(crate) WorkflowsCommand);

impl OnPayments for Operate {
    type Output = onceflow_engine::Result<()>;

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
        let engine = payments.engine();
        match self.0 {
            WorkflowsCommand::List { state, tenant, limit, .. } => {
                let filter = onceflow_engine::store::WorkflowFilter {
                    state: state.as_deref(),
                    tenant: tenant.as_deref(),
                    ..Default::default()
                };
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

/// A value as a line of text: a string as itself, anything else as compact JSON.
fn text(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
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

/// `workflows show`: the workflow's fields, its input, output and error, its steps (each with its output or
/// error) and its compensations.
fn shown(view: WorkflowView) -> String {
    let w = redacted(view.workflow);
    let mut out = String::new();
    for (label, key) in [
        ("workflow", "workflow_id"),
        ("name", "name"),
        ("state", "state"),
        ("epoch", "lease_epoch"),
        ("created", "created_at"),
        ("updated", "updated_at"),
        ("next try", "next_attempt_at"),
        ("lease to", "lease_expires_at"),
    ] {
        if let Some(value) = w.get(key).filter(|v| !v.is_null()) {
            out.push_str(&format!("{label:<10}{}\n", text(value)));
        }
    }
    for key in ["input", "output", "error"] {
        block(&mut out, &format!("\n{key}"), &w[key]);
    }
    out.push_str(&format!(
        "\n{:<36} {:<14} {:<10} {:>8}  {:<24}  FINISHED\n",
        "STEP", "KIND", "STATUS", "ATTEMPTS", "STARTED"
    ));
    for step in view.steps {
        let s = step_view(step);
        let field = |k: &str| s.get(k).filter(|v| !v.is_null()).map(text).unwrap_or_default();
        out.push_str(&format!(
            "{:<36} {:<14} {:<10} {:>8}  {:<24}  {}\n",
            field("step_key"),
            field("kind"),
            field("status"),
            field("attempts"),
            field("started_at"),
            field("finished_at")
        ));
        for key in ["output", "error"] {
            if !s[key].is_null() {
                out.push_str(&format!("    {key:<7}{}\n", s[key]));
            }
        }
    }
    if !view.compensations.is_empty() {
        out.push_str(&format!("\n{:>4} {:<36} {:<16} STATUS\n", "SEQ", "STEP", "COMPENSATION"));
        for c in view.compensations {
            out.push_str(&format!("{:>4} {:<36} {:<16} {}\n", c.seq, c.step_key, c.name, c.status));
        }
    }
    out
}
