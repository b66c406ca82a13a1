//! Where refunds are kept: the [`RefundStore`] trait, which every [`super::PaymentStore`] also is. Each backend
//! runs the refund saga's phases as it runs best — Postgres and SQLite as statement phases
//! (`refund_statement.rs`, with the queries they share in `refund_standard.rs`), MySQL as closure steps in one
//! transaction (`mysql/refunds.rs`) — with the same steps, outputs and rows on every backend.

use std::future::Future;

use onceflow_engine::{Conn, Failure, Interrupt, StepSpec, Store, WorkflowContext};
use serde::{Deserialize, Serialize};

use super::Sql;
use crate::model::{
    RefundInput, RefundNo, RefundRecord, RefundRecorded, RequestNo, StoredResponse, Token, TokenRecord,
};

/// How reserving a refund's amount on its payment went (the output of `reserve_amount`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefundReserve {
    /// `refund_reserved + amount`, the payment's refunds (succeeded, in flight and this one) within its amount.
    Reserved,
    /// The payment is not `succeeded` (processing, declined, failed): nothing of it can be refunded.
    NotRefundable,
    /// More than is left to refund.
    Exceeds,
}

/// What the refund saga's first phase came to: the refund recorded (`None`: its `refund_no` is another
/// refund's), and, once recorded, the reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundPhase {
    /// What recording the refund fixed, if this refund was recorded.
    pub recorded: Option<RefundRecorded>,
    /// The reservation, if the refund was recorded.
    pub reserve: Option<RefundReserve>,
}

/// The steps of the refund saga's first phase, in order: `claim_token`, `insert_refund`, `reserve_amount`, and
/// the channel call that follows it (whose intent a backend may commit with the phase).
pub struct RefundSteps {
    /// Token `issued → in_use`.
    pub claim: StepSpec,
    /// The refund record, `processing`.
    pub insert: StepSpec,
    /// The amount reserved on the payment.
    pub reserve: StepSpec,
    /// The channel call the phase leads to.
    pub call: StepSpec,
}

/// How a refund that is still `processing` ends ([`RefundStore::end_refund`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefundEnd {
    /// The channel refunded it: `succeeded` with the channel's id, its reservation moved to the payment's
    /// `refunded_amount`, and the order `paid → refunded` once the payment's refunds cover it.
    Succeeded {
        /// The channel's refund id.
        refund_id: String,
    },
    /// The channel failed or refused it: `failed`, its reservation released.
    Released,
    /// Refused before the channel (it reserved nothing): `failed`.
    Rejected,
}

/// A [`Store`] that also keeps refunds (and the payments' refund amounts).
///
/// The phases take the workflow's context; functions taking a connection run inside a step's transaction.
pub trait RefundStore: Store {
    /// Phase 1: token `issued → in_use` bound to the request; the refund recorded `processing` (only once the
    /// token is claimed, with the payment's order and currency); the amount reserved on the payment (only once
    /// the refund is recorded) by one conditional update, `refunded + reserved + amount <= amount of the
    /// payment` of a `succeeded` payment. Unless the token is claimed and the tenant has the payment nothing is
    /// written and the body is [`Interrupt::Refused`] with `refused`.
    fn reserve_refund(
        ctx: &mut WorkflowContext<Self>,
        input: &RefundInput,
        now: i64,
        steps: RefundSteps,
        refused: Failure,
    ) -> impl Future<Output = Result<RefundPhase, Interrupt>> + Send;

    /// Phase 2, with the channel's success: the refund `succeeded` with `refund_id`, its amount moved from the
    /// payment's `refund_reserved` to its `refunded_amount`, the order `paid → refunded` once they cover the
    /// payment, the token `completed` with `response` — which the body returns at once, as the workflow's
    /// output (a backend may write this phase with the workflow's end). Unless the refund was `processing`
    /// under this token nothing is written and the step `spec` fails with `not_processing`.
    #[allow(clippy::too_many_arguments)]
    fn confirm_refund(
        ctx: &mut WorkflowContext<Self>,
        input: &RefundInput,
        now: i64,
        spec: StepSpec,
        refund_id: String,
        response: StoredResponse,
        not_processing: Failure,
    ) -> impl Future<Output = Result<StoredResponse, Interrupt>> + Send;

    /// Ends the refund of `input` — the tenant's `refund_no` recorded under its token — as `end` says, while it
    /// is `processing`: never another refund, never one that ended; whether it did. Its payment's amounts move
    /// with it in the same transaction, so a reservation is released or moved exactly once.
    fn end_refund<'c>(conn: &'c mut Conn<Self>, input: RefundInput, end: RefundEnd, now: i64) -> Sql<'c, bool>;

    /// Adds `amount` to what the tenant's payment `request_no` has refunded: the part of its charge a cancelled
    /// payment's compensation refund gave back before the rest was kept (the payment rolled forward).
    fn add_refunded<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        request_no: RequestNo,
        amount: i64,
        now: i64,
    ) -> Sql<'c, ()>;

    /// What is left to refund of the tenant's payment `request_no` now: its amount less every succeeded or
    /// in-flight refund of it (0 for a payment it does not have).
    fn refundable<'c>(conn: &'c mut Conn<Self>, tenant: String, request_no: RequestNo) -> Sql<'c, i64>;

    /// One refund, read in a step's transaction.
    fn refund_in<'c>(conn: &'c mut Conn<Self>, tenant: String, refund_no: RefundNo) -> Sql<'c, Option<RefundRecord>>;

    /// One refund.
    fn refund(
        &self,
        tenant: &str,
        refund_no: &RefundNo,
    ) -> impl Future<Output = Result<Option<RefundRecord>, sqlx::Error>> + Send;

    /// Every refund of the tenant's payment `request_no`, newest first, through the index `refunds_payment`.
    fn refunds_of_payment(
        &self,
        tenant: &str,
        request_no: &RequestNo,
    ) -> impl Future<Output = Result<Vec<RefundRecord>, sqlx::Error>> + Send;

    /// One token, and whether the tenant has the payment: the two checks of a refused refund, in one round
    /// trip.
    fn token_and_payment(
        &self,
        token: &Token,
        tenant: &str,
        request_no: &RequestNo,
    ) -> impl Future<Output = Result<Option<(TokenRecord, bool)>, sqlx::Error>> + Send;

    /// How many refunds are unresolved (`processing`: asked of the channel, its outcome unknown or processing)
    /// and the oldest one's `created_at` (ms), through the index `refunds_unresolved`.
    fn unresolved_refunds(&self) -> impl Future<Output = Result<(i64, Option<i64>), sqlx::Error>> + Send;

    /// The unresolved refunds created at or before `created_before` (ms), oldest first, at most `limit`, of
    /// `tenant` only when given, through the index `refunds_unresolved`.
    fn unresolved_refunds_before(
        &self,
        tenant: Option<&str>,
        created_before: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<RefundRecord>, sqlx::Error>> + Send;

    /// Every refund (for the invariant checker).
    fn all_refunds(&self) -> impl Future<Output = Result<Vec<RefundRecord>, sqlx::Error>> + Send;
}

/// A token row with whether the tenant has the payment (see [`RefundStore::token_and_payment`]).
#[derive(sqlx::FromRow)]
pub(super) struct TokenPaymentCheck {
    #[sqlx(flatten)]
    pub(super) token: TokenRecord,
    pub(super) payment_exists: bool,
}
