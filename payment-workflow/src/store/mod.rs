//! Where orders, tokens and payment records are kept: the [`PaymentStore`] trait, and one file per backend that
//! owns its SQL — how it runs the saga's two atomic phases (`postgres.rs`, `sqlite.rs`: one call of SQL with the
//! commit; `mysql.rs`: closure steps in a transaction), the writes of the compensations, and the service's reads.
//! Refunds are kept by the same stores, through [`RefundStore`] (`refund.rs`), which every `PaymentStore` is.

use std::future::Future;

use onceflow_engine::{BoxFuture, Conn, Failure, Interrupt, StepError, StepSpec, Store, WorkflowContext};

use crate::model::PaymentInput;
use crate::model::{
    Currency, Order, OrderNo, OrderStatus, PaymentRecord, PaymentStatus, RequestNo, StoredResponse, Token, TokenRecord,
};

mod channel_word;
mod lock;
mod mysql;
mod postgres;
mod refund;
mod refund_standard;
mod refund_statement;
mod sqlite;
mod standard;
mod statement;

pub use channel_word::{ChannelWord, ChannelWordStore, ExceptionRow, ReconciliationRow, StagedLine, StatementCopy};
pub use lock::PassLock;
pub use refund::{RefundEnd, RefundPhase, RefundReserve, RefundSteps, RefundStore};
pub use statement::PhaseDialect;

/// The tokens a retention pass deletes, each kind by the time its retention counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Never used (`issued`), deleted once expired (`expires_at`).
    Unused,
    /// Used (`completed`, with the stored response), deleted once the response retention has passed since the
    /// payment ended (`updated_at`). A token still `in_use` (its payment is unfinished) is never deleted.
    Used,
}

/// Where a page of an order's payments ends: the `created_at` and `request_no` of its last (oldest) record; the
/// next page holds the records before it in that order. A position, whether or not a record is there: its
/// number is any text (compared, never looked up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentCursor {
    /// The last record's creation time (ms).
    pub created_at: i64,
    /// The last record's number (breaking ties within a millisecond).
    pub request_no: String,
}

/// How reserving an order for payment went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Reserve {
    /// `pending → paying`, version + 1.
    Reserved,
    /// No such order for this tenant.
    NotFound,
    /// Amount or currency differ from the order's.
    Mismatch,
    /// Paid, or another attempt is in flight.
    NotPayable,
}

impl Reserve {
    /// Why an order (its amount and currency as `found`, if it exists) could not be reserved.
    fn refused(found: Option<(i64, String)>, amount: i64, currency: &Currency) -> Self {
        match found {
            None => Self::NotFound,
            Some((a, c)) if a != amount || c != currency.as_str() => Self::Mismatch,
            Some(_) => Self::NotPayable,
        }
    }
}

/// The steps of the saga's first phase, in order: `claim_token`, `insert_record`, `reserve_status`, and the
/// channel call that follows it (whose intent a backend may commit with the phase).
pub struct ReserveSteps {
    /// Token `issued → in_use`.
    pub claim: StepSpec,
    /// The payment record.
    pub insert: StepSpec,
    /// Order `pending → paying`.
    pub reserve: StepSpec,
    /// The channel call the phase leads to.
    pub charge: StepSpec,
}

/// A transactional step's body as the store's queries give it.
pub type Sql<'c, T> = BoxFuture<'c, Result<T, StepError>>;

/// The database error inside an engine error (getting a writer fails only on the database).
fn engine_error(e: onceflow_engine::Error) -> sqlx::Error {
    match e {
        onceflow_engine::Error::Database(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

/// The fingerprint of a queued command's unused token whose number another payment has (see
/// [`PaymentStore::mark_number_taken`]): no request's fingerprint (those are SHA-256 in hex).
pub const NUMBER_TAKEN: &str = "number_taken";

/// A [`Store`] that also keeps orders, tokens and payment records (and, as a [`RefundStore`], refunds; as an
/// [`crate::EventStore`], the merchant events their outcomes write; as a [`ChannelWordStore`], the channel's
/// notifications and statements).
///
/// The saga's phases take the workflow's context: each backend runs them as it runs best, with the same steps,
/// outputs and rows on every backend. Functions taking a connection run inside a step's transaction.
pub trait PaymentStore: Store + RefundStore + crate::events::EventStore + ChannelWordStore {
    /// Applies the engine's migrations, then the payment tables' (this crate's `migrations/<backend>/`).
    fn migrate_payments(&self) -> impl Future<Output = Result<(), onceflow_engine::Error>> + Send;

    /// Phase 1: token `issued → in_use` bound to the request, the record inserted (only once the token is
    /// claimed), the order `pending → paying` reserved by this payment (only once the record is inserted).
    /// The reservation, or `None` when the record's `request_no` is taken. Unless the token is claimed and the
    /// order exists nothing is written and the body is [`Interrupt::Refused`] with `refused` (before the
    /// workflow's first commit nothing of it is then recorded, and the start is refused).
    fn reserve(
        ctx: &mut WorkflowContext<Self>,
        input: &PaymentInput,
        now: i64,
        steps: ReserveSteps,
        refused: Failure,
    ) -> impl Future<Output = Result<Option<Reserve>, Interrupt>> + Send;

    /// Phase 2, with the channel's success: order `paying → paid`, the record `succeeded` with `charge_id`, the
    /// token `completed` with `response` — which the body returns at once, as the workflow's output (a backend
    /// may write this phase with the workflow's end). Unless the order was `paying` under this payment's
    /// reservation nothing is written and the step `spec` fails with `not_paying`.
    fn confirm(
        ctx: &mut WorkflowContext<Self>,
        input: &PaymentInput,
        now: i64,
        spec: StepSpec,
        charge_id: String,
        response: StoredResponse,
        not_paying: Failure,
    ) -> impl Future<Output = Result<StoredResponse, Interrupt>> + Send;

    /// Order `paying → to`, version + 1, only while the payment `request_no` holds it (its reservation, not
    /// another payment's); whether it did.
    fn move_order<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        order_no: OrderNo,
        request_no: RequestNo,
        to: OrderStatus,
        now: i64,
    ) -> Sql<'c, bool>;

    /// Sets the status of this payment's record — the tenant's `request_no` inserted under `token` — while it is
    /// `processing`: never another payment's record, never a final one. `code`: of a `declined` payment, the
    /// channel's decline code (`decline_code`); of a `failed` one, its answer's problem code (`failure_code`),
    /// from which that answer is rebuilt once its token is gone. Whether it did (the payment's end, whose event
    /// the caller writes in the same transaction).
    fn fail_payment<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        request_no: RequestNo,
        token: Token,
        status: PaymentStatus,
        code: Option<String>,
        now: i64,
    ) -> Sql<'c, bool>;

    /// Token `in_use → completed` with its final response (a completed token keeps its first one).
    fn complete_token<'c>(
        conn: &'c mut Conn<Self>,
        token: Token,
        response_status: i32,
        body: String,
        now: i64,
    ) -> Sql<'c, ()>;

    /// Inserts an order; `false` when the tenant has one with this `order_no`.
    fn insert_order(&self, order: &Order) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// One order.
    fn order(
        &self,
        tenant: &str,
        order_no: &OrderNo,
    ) -> impl Future<Output = Result<Option<Order>, sqlx::Error>> + Send;
    /// Stores a newly issued token.
    fn insert_token(&self, token: &TokenRecord) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Stores `token` unless one with its value exists (a queued command's token, derived from its
    /// `request_no`: every delivery of the command ensures the same one). An existing token that is still
    /// `issued` but expired — its command waited in the queue past the expiry — lives again until
    /// `token.expires_at`; a used token is never touched.
    fn ensure_token(&self, token: &TokenRecord) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Completes a token that is still unused (`issued`) with a final answer given before anything was
    /// recorded, bound to `fingerprint` and `route`, unless the token's tenant has a payment under `request_no`
    /// or the token was marked by [`PaymentStore::mark_number_taken`]; whether it did (`false`: a payment claimed
    /// the token or has the number).
    fn settle_unused_token(
        &self,
        token: &Token,
        request_no: &RequestNo,
        fingerprint: &str,
        route: &str,
        response: &StoredResponse,
        now: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// Marks a queued command's token that is still unused (`issued`) as one whose number another payment has
    /// (fingerprint [`NUMBER_TAKEN`]): a settle of it decided on an older reading of the payments (a statement
    /// snapshot from before that payment's commit) then fails, and this waits for one under way. Whether it was
    /// still unused. A payment may still claim the token.
    fn mark_number_taken(&self, token: &Token) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    /// One token, and whether the tenant has the order: the two checks of a refused payment, in one round trip.
    fn token_and_order(
        &self,
        token: &Token,
        tenant: &str,
        order_no: &OrderNo,
    ) -> impl Future<Output = Result<Option<(TokenRecord, bool)>, sqlx::Error>> + Send;
    /// One payment record.
    fn payment(
        &self,
        tenant: &str,
        request_no: &RequestNo,
    ) -> impl Future<Output = Result<Option<PaymentRecord>, sqlx::Error>> + Send;
    /// The payments whose channel charge is `charge_id` (an operator's search), of `tenant` only when given, at
    /// most `limit`, newest first, through the index `payments_charge` (migration 0058).
    fn payments_by_charge(
        &self,
        tenant: Option<&str>,
        charge_id: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<PaymentRecord>, sqlx::Error>> + Send;
    /// Every payment record of the tenant's order `order_no` (each attempt), newest first, through the index
    /// `payments_order_page`.
    fn payments_of_order(
        &self,
        tenant: &str,
        order_no: &OrderNo,
    ) -> impl Future<Output = Result<Vec<PaymentRecord>, sqlx::Error>> + Send;
    /// At most `limit` payment records of the tenant's order `order_no`, newest first (by `created_at`, then
    /// `request_no`), those after `after` when given: one range of the index `payments_order_page`, however many
    /// attempts the order has (every refused one is a record, kept for good).
    fn payments_of_order_page(
        &self,
        tenant: &str,
        order_no: &OrderNo,
        after: Option<&PaymentCursor>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<PaymentRecord>, sqlx::Error>> + Send;
    /// How many payments are unresolved (their record still `processing`: the charge outcome is unknown or the
    /// channel said processing) and the oldest one's `created_at` (ms), through the partial index
    /// `payments_unresolved` (no scan of the payments table).
    fn unresolved(&self) -> impl Future<Output = Result<(i64, Option<i64>), sqlx::Error>> + Send;
    /// The unresolved payments created at or before `created_before` (ms), oldest first, at most `limit`, of
    /// `tenant` only when given: `(tenant, request_no, created_at)`.
    fn unresolved_before(
        &self,
        tenant: Option<&str>,
        created_before: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<(String, RequestNo, i64)>, sqlx::Error>> + Send;
    /// Deletes up to `limit` tokens of `kind` whose retention ended at or before `by` (ms: for unused tokens,
    /// now; for used ones, now minus the response retention), in one short statement; how many. A token that
    /// changed meanwhile (revived, claimed) is deleted only if it still qualifies.
    fn delete_tokens(
        &self,
        kind: TokenKind,
        by: i64,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    /// How many tokens [`PaymentStore::delete_tokens`] would delete with no limit (a dry run).
    fn count_tokens(&self, kind: TokenKind, by: i64) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    /// Takes the retention pass's lock without waiting: `None` when another process holds it.
    fn lock_pass(&self) -> impl Future<Output = Result<Option<PassLock>, sqlx::Error>> + Send;
    /// Every order (for the invariant checker).
    fn all_orders(&self) -> impl Future<Output = Result<Vec<Order>, sqlx::Error>> + Send;
    /// Every payment record (for the invariant checker).
    fn all_payments(&self) -> impl Future<Output = Result<Vec<PaymentRecord>, sqlx::Error>> + Send;

    /// This payment's record — the tenant's `request_no` inserted under `token` — `processing → succeeded` with
    /// `charge_id`, a payment that rolled forward (its charge could not be refunded); whether it did. Never
    /// another payment's record, never a final one.
    fn succeed_payment<'c>(
        conn: &'c mut Conn<Self>,
        tenant: String,
        request_no: RequestNo,
        token: Token,
        charge_id: String,
        now: i64,
    ) -> Sql<'c, bool>;
}

/// A token row with whether the tenant has the order (see [`PaymentStore::token_and_order`]).
#[derive(sqlx::FromRow)]
struct TokenCheck {
    #[sqlx(flatten)]
    token: TokenRecord,
    order_exists: bool,
}
