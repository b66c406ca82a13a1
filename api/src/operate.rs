//! `onceflow workflows list | show | retry | cancel`: what an operator sees over HTTP (`GET /v1/workflows/{id}`:
//! the same fields, built by the same types — RFC 3339 times, input, output and errors as JSON, no token),
//! printed for people.

use onceflow_engine::WorkflowView;
use onceflow_engine::store::{AuditRecord, WorkflowRecord, WorkflowState};
use onceflow_payments::{PaymentStore, Payments};
use serde_json::Value;

use crate::config::WorkflowsCommand;
use crate::database::OnPayments;
use crate::routes::views::WorkflowDetail;
use crate::text::printable;

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
                let audit = engine.audit(Some(&workflow_id), None, onceflow_engine::MAX_AUDIT).await?;
                let view = engine.workflow(&workflow_id).await?.ok_or(onceflow_engine::Error::NotFound(workflow_id))?;
                print!("{}", shown(view, audit));
            }
            WorkflowsCommand::Retry { workflow_id, reason, .. } => {
                let state = audited(engine, "retry", &workflow_id, reason, engine.retry(&workflow_id)).await?;
                println!("{workflow_id} is now {state}");
            }
            WorkflowsCommand::Cancel { workflow_id, reason, .. } => {
                let state = audited(engine, "cancel", &workflow_id, reason, engine.cancel(&workflow_id)).await?;
                println!("{workflow_id} is now {state}");
            }
        }
        Ok(())
    }
}

/// Runs the action `act` on workflow `workflow_id` on the record, as the HTTP API does (see
/// `routes/audit.rs`): recorded as `cli:<user>`'s before it runs, completed with its answer after. A workflow that
/// does not exist is not acted on, nor recorded.
async fn audited<S: PaymentStore>(
    engine: &onceflow_engine::Engine<S>,
    action: &str,
    workflow_id: &str,
    reason: Option<String>,
    act: impl std::future::Future<Output = onceflow_engine::Result<WorkflowRecord>>,
) -> onceflow_engine::Result<WorkflowState> {
    let record = engine
        .store()
        .workflow(workflow_id)
        .await?
        .ok_or_else(|| onceflow_engine::Error::NotFound(workflow_id.into()))?;
    // The reason was checked as the command line was read (`config::parse_reason`).
    let entry = onceflow_engine::AuditAction {
        actor: cli_actor(std::env::var("USER").ok()),
        action: action.to_owned(),
        workflow_id: Some(record.workflow_id),
        subject: None,
        tenant: record.tenant,
        reason,
    };
    let id = engine.audit_begin(entry).await?;
    let done = act.await;
    let (status, result) = match &done {
        Ok(w) => (200, format!("now {}", w.state)),
        Err(e) => {
            let problem = crate::error::ApiError::from(clone_error(e));
            (problem.status.as_u16(), format!("{}: {}", problem.code, problem.detail))
        }
    };
    engine.audit_end(&id, status, &result).await?;
    done.map(|w| w.state)
}

/// Longest user name kept in an actor `cli:<user>`.
const MAX_USER: usize = 64;

/// `cli:<user>` for the terminal's user (`$USER`): control characters dropped, at most [`MAX_USER`] characters.
pub(crate) fn cli_actor(user: Option<String>) -> String {
    let user: String = user.unwrap_or_default().chars().filter(|c| !c.is_control()).take(MAX_USER).collect();
    format!("cli:{}", if user.is_empty() { "unknown" } else { &user })
}

/// The parts of an engine error its answer is made of (the error itself is not `Clone`).
fn clone_error(e: &onceflow_engine::Error) -> onceflow_engine::Error {
    match e {
        onceflow_engine::Error::NotFound(id) => onceflow_engine::Error::NotFound(id.clone()),
        onceflow_engine::Error::InvalidState { workflow_id, state, reason } => {
            onceflow_engine::Error::InvalidState { workflow_id: workflow_id.clone(), state: state.clone(), reason }
        }
        other => onceflow_engine::Error::Interrupted(other.to_string()),
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
/// steps (each with its output or error), its compensations and its audit log.
fn shown(view: WorkflowView, audit: Vec<AuditRecord>) -> String {
    let WorkflowDetail { workflow: w, steps, compensations, waiting_for, .. } = view.into();
    let mut out = String::new();
    for (label, value) in [
        ("workflow", Some(w.workflow_id)),
        ("name", Some(w.name)),
        ("state", Some(w.state.to_string())),
        ("epoch", Some(w.lease_epoch.to_string())),
        ("created", Some(w.created_at)),
        ("updated", Some(w.updated_at)),
        ("next try", w.next_attempt_at),
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
    audit_table(&mut out, audit);
    out
}

/// A workflow's audit entries as `workflows show` prints them, one line each.
fn audit_table(out: &mut String, audit: Vec<AuditRecord>) {
    if !audit.is_empty() {
        out.push_str(&format!("\n{:<24}  {:<16} {:<14} {:<28} REASON\n", "AUDIT", "ACTOR", "ACTION", "RESULT"));
        for a in audit {
            let at = crate::routes::orders::rfc3339(a.at);
            // What people typed (a reason, a user's name) is shown escaped: one entry, one line, no terminal control.
            let result = a.result.map_or_else(|| "(no answer: interrupted)".to_owned(), |r| printable(&r, 200));
            let reason = printable(&a.reason.unwrap_or_default(), crate::routes::audit::MAX_REASON);
            let (actor, action) = (printable(&a.actor, 80), printable(&a.action, 40));
            out.push_str(&format!("{at:<24}  {actor:<16} {action:<14} {result:<28} {reason}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use onceflow_engine::store::AuditRecord;

    #[test]
    fn the_cli_actor_is_bounded_and_plain() {
        assert_eq!(super::cli_actor(Some("alice".into())), "cli:alice");
        assert_eq!(super::cli_actor(None), "cli:unknown");
        assert_eq!(super::cli_actor(Some("\u{1b}[31m".into())), "cli:[31m");
        assert_eq!(super::cli_actor(Some("x".repeat(1000))).len(), 4 + super::MAX_USER);
    }

    #[test]
    fn an_audit_entry_prints_on_one_line_without_terminal_control() {
        let entry = AuditRecord {
            id: "a1".into(),
            at: 0,
            actor: "ops\u{1b}[2J".into(),
            action: "cancel".into(),
            workflow_id: Some("pay:x".into()),
            subject: None,
            tenant: Some("acme".into()),
            reason: Some("line one\nline two\r\u{1b}[31mred".into()),
            status: Some(200),
            result: Some("now compensating".into()),
        };
        let mut printed = String::new();
        super::audit_table(&mut printed, vec![entry]);
        // A blank line, the heading, the entry.
        assert_eq!(printed.trim_start().lines().count(), 2, "{printed}");
        assert!(!printed.contains('\u{1b}') && !printed.contains('\r'), "{printed:?}");
        assert!(printed.contains("line one\\nline two\\r\\u{1b}[31mred"), "{printed}");
    }
}
