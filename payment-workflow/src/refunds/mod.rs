//! The refund saga, the engine's second workflow type: `claim_token`, `insert_refund`, `reserve_amount` (one
//! atomic phase), `call_refund` (external), `confirm_refund`, with a compensation for each step that undoes only
//! what that step did for this refund (`saga.rs`); the channel call and what its answers mean (`call.rs`); the
//! answers a refund gives that are not the refund itself (`answer.rs`); a refund's end outside its confirming
//! phase, with its event (`end.rs`).

mod answer;
mod call;
mod end;
mod saga;

pub(crate) use answer::{payment_not_found, refund_failed};
pub use saga::RefundSaga;
