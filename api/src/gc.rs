//! `onceflow gc [--dry-run]`: one retention pass now, printing per kind how many rows it deleted (or, with
//! `--dry-run`, would delete).

use onceflow_payments::{PassReport, PaymentStore, Payments, Retention};

use crate::database::OnPayments;

/// The pass, on the service once it is connected.
pub(crate) struct Gc {
    /// What to keep.
    pub(crate) retention: Retention,
    /// How long events are kept.
    pub(crate) events: onceflow_payments::EventSettings,
    /// Count only.
    pub(crate) dry_run: bool,
}

impl OnPayments for Gc {
    type Output = anyhow::Result<()>;

    async fn run<S: PaymentStore>(self, payments: Payments<S>) -> Self::Output {
        let payments = payments.with_retention(self.retention).with_events(self.events);
        match payments.retention_pass(self.dry_run).await? {
            Some(report) => print!("{}", render(&report)),
            None => println!("another process is running a retention pass: nothing deleted"),
        }
        Ok(())
    }
}

/// One line per kind: `deleted unused_tokens 3`, or `would delete unused_tokens 3` for a dry run.
fn render(report: &PassReport) -> String {
    let verb = if report.dry_run { "would delete" } else { "deleted" };
    report.kinds().iter().map(|(kind, rows)| format!("{verb} {kind} {rows}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_one_line_per_kind() {
        let report = PassReport { unused_tokens: 3, used_tokens: 2, workflows: 1, steps: 5, events: 4, dry_run: true };
        assert_eq!(
            render(&report),
            "would delete unused_tokens 3\nwould delete used_tokens 2\nwould delete workflows 1\nwould delete steps 5\n\
             would delete events 4\n"
        );
    }
}
