//! The payment saga: `claim_token`, `insert_record`, `reserve_status` (one atomic phase), `call_channel`
//! (external), `confirm`, with the compensations DESIGN.md lists (`saga.rs`); the channel call, what its answers
//! mean, and undoing a charge (`charge.rs`).

mod charge;
mod saga;

pub(crate) use charge::pending_retry;
pub use saga::PaymentSaga;
