//! Reconciliation (对账, `contracts/http-api.md`): each day's channel statement, per tenant, matched against
//! onceflow's payments and refunds. The statement is read as a stream into a copy in the database (a repeated
//! line is the same entry), then matched in batches, so memory does not grow with the day's length; the results
//! — counts per class and the exceptions — are written under a new run id and made current in one statement,
//! so a run that stops halfway (the channel gone, a crash) leaves the previous results whole, and a run again
//! replaces them. It never moves money: a payment the statement settles gets the statement's word recorded
//! (as a notification is) for its workflow to apply; everything else is listed for an operator.
//!
//! `classify.rs` says what each entry is; `run.rs` runs a day; `schedule.rs` runs the days when they are due;
//! `view.rs` is what the API and the command show.

mod classify;
mod run;
mod schedule;
mod view;

pub use classify::Class;
pub use run::{ReconcileError, ReconcileReport, Reconciler};
pub use view::{ReconciledException, Reconciliation, reconciliations};
