//! The saga's two atomic phases as statement phases, on the backends that have them (Postgres, SQLite): each is
//! sent with its commit as one call (Postgres: one statement of data-modifying CTEs; SQLite: one multi-statement
//! call to the writer), so a payment's phase costs one round trip instead of a transaction of four to six. The
//! outputs are the JSON MySQL's closure steps store (`true`, `"Reserved"`, the stored response), so a
//! workflow's step rows read the same on every backend. The second phase writes the payment's event too (the
//! outbox: `events/outbox.rs`).

use onceflow_engine::phase::{PhaseStep, SqlArg, StatementPhase};
use onceflow_engine::store::SQLITE_PHASE_FLAGS;
use onceflow_engine::{Failure, Interrupt, Store, WorkflowContext};

use super::{Reserve, ReserveSteps};
use crate::events::outbox;
use crate::model::PaymentInput;
use crate::model::{PaymentEnd, StoredResponse};

/// Runs phase 1 (see [`super::PaymentStore::reserve`]) as one statement phase in dialect `d`.
pub(super) async fn run_reserve<S: Store>(
    ctx: &mut WorkflowContext<S>,
    d: PhaseDialect,
    i: &PaymentInput,
    now: i64,
    steps: ReserveSteps,
    refused: Failure,
) -> Result<Option<Reserve>, Interrupt> {
    // Outputs: claimed (always, past the guard), inserted, the reservation (once inserted), the intent.
    let outputs = ctx.statement_phase(reserve(d, i, now, steps, refused)).await?;
    let inserted: bool = decode(outputs.get(1))?;
    if inserted { Ok(Some(decode(outputs.get(2))?)) } else { Ok(None) }
}

/// Runs phase 2 (see [`super::PaymentStore::confirm`]) in dialect `d`, written by the commit that completes
/// the workflow: one statement for the channel's outcome, `confirm`, and the workflow's end.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_confirm<S: Store>(
    ctx: &mut WorkflowContext<S>,
    d: PhaseDialect,
    i: &PaymentInput,
    now: i64,
    spec: onceflow_engine::StepSpec,
    charge_id: &str,
    response: StoredResponse,
    not_paying: Failure,
) -> Result<StoredResponse, Interrupt> {
    let phase = confirm(d, i, now, spec, charge_id, &response, not_paying);
    ctx.finish_with(phase, response).await
}

/// A statement phase step's output as its type.
pub(super) fn decode<T: serde::de::DeserializeOwned>(
    output: Option<&Option<serde_json::Value>>,
) -> Result<T, Interrupt> {
    let value = output.and_then(Option::as_ref).unwrap_or(&serde_json::Value::Null);
    T::deserialize(value).map_err(|e| Interrupt::Engine(e.into()))
}

/// The SQL dialect of a store's statement phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseDialect {
    /// One statement: each write a data-modifying CTE.
    Postgres,
    /// Statements in order inside the commit's transaction, each write followed by a flag of whether it wrote.
    Sqlite,
}

impl PhaseDialect {
    /// The phase's parts for the write `dml` (an `INSERT` or `UPDATE` of at most one row) named `name`, which
    /// later parts test with [`PhaseDialect::wrote`].
    pub fn write(self, name: &str, dml: &str) -> Vec<String> {
        match self {
            Self::Postgres => vec![format!("{name} AS ({dml} RETURNING 1)")],
            Self::Sqlite => {
                vec![dml.to_owned(), format!("INSERT INTO {SQLITE_PHASE_FLAGS} SELECT '{name}' WHERE changes() > 0")]
            }
        }
    }

    /// Whether the write `name` wrote its row (an SQL boolean).
    pub fn wrote(self, name: &str) -> String {
        match self {
            Self::Postgres => format!("EXISTS (SELECT 1 FROM {name})"),
            Self::Sqlite => format!("EXISTS (SELECT 1 FROM {SQLITE_PHASE_FLAGS} WHERE flag = '{name}')"),
        }
    }
}

/// `claim_token`, `insert_record` (only once the token is claimed), `reserve_status` (only once the record
/// is inserted) and, once the order is reserved, the intent of the channel call `charge`. Unless the token is
/// claimed and the order exists nothing is written and `claim_token` fails with `not_claimed`.
fn reserve(d: PhaseDialect, i: &PaymentInput, now: i64, steps: ReserveSteps, not_claimed: Failure) -> StatementPhase {
    let ReserveSteps { claim, insert, reserve, charge } = steps;
    let (claimed, inserted, reserved) = (d.wrote("p_token"), d.wrote("p_record"), d.wrote("p_order"));
    let mut parts = d.write(
        "p_token",
        "UPDATE idempotency_tokens SET state = 'in_use', fingerprint = $3, route = $4, updated_at = $5 \
         WHERE token = $1 AND tenant = $2 AND state = 'issued' AND expires_at > $5",
    );
    parts.extend(d.write(
        "p_record",
        &format!(
            "INSERT INTO payments (tenant, request_no, order_no, amount, currency, status, token, charge_id, \
             decline_code, created_at, updated_at) \
             SELECT $2, $6, $7, $8, $9, 'processing', $1, NULL, NULL, $5, $5 WHERE {claimed} \
             ON CONFLICT (tenant, request_no) DO NOTHING"
        ),
    ));
    parts.extend(d.write(
        "p_order",
        &format!(
            "UPDATE orders SET status = 'paying', version = version + 1, reserved_by = $6, updated_at = $5 \
             WHERE tenant = $2 AND order_no = $7 AND status = 'pending' AND amount = $8 AND currency = $9 \
             AND {inserted}"
        ),
    ));
    let args = vec![
        SqlArg::Text(i.token.as_str().to_owned()),
        SqlArg::Text(i.tenant.clone()),
        SqlArg::Text(i.fingerprint.clone()),
        SqlArg::Text(i.route.clone()),
        SqlArg::Int(now),
        SqlArg::Text(i.request_no.as_str().to_owned()),
        SqlArg::Text(i.order_no.as_str().to_owned()),
        SqlArg::Int(i.amount),
        SqlArg::Text(i.currency.as_str().to_owned()),
    ];
    // Amount and currency are never updated, so reading the order here (before the phase's writes on Postgres,
    // after them on SQLite) finds the same.
    let found = "EXISTS (SELECT 1 FROM orders WHERE tenant = $2 AND order_no = $7)";
    // As `Reserve` serializes; the same reading of the order as `Reserve::refused`.
    let reservation = format!(
        "CASE WHEN {reserved} THEN '\"Reserved\"' WHEN NOT {found} THEN '\"NotFound\"' \
         WHEN EXISTS (SELECT 1 FROM orders WHERE tenant = $2 AND order_no = $7 AND (amount <> $8 OR currency <> $9)) \
         THEN '\"Mismatch\"' ELSE '\"NotPayable\"' END"
    );
    let steps = vec![
        PhaseStep::new(claim, format!("CASE WHEN {claimed} THEN 'true' ELSE 'false' END")),
        PhaseStep::new(insert, format!("CASE WHEN {inserted} THEN 'true' ELSE 'false' END")),
        PhaseStep::new(reserve, reservation).when(inserted),
        PhaseStep::intent(charge).when(reserved.clone()),
    ];
    // An unknown order is not stored either: the token stays unbound (a start that is the workflow's first
    // commit is refused). A reserved order exists: the lookup is left for the payments that did not reserve.
    let guard = format!("{claimed} AND ({reserved} OR {found})");
    StatementPhase::new(parts, args, steps).guard(guard, not_claimed)
}

/// `confirm`: order `paying → paid`, the record `succeeded` with `charge_id`, the token `completed` with the
/// 201 `response`, which is also the step's output. Unless the order was `paying` under this payment's
/// reservation (and its record and token still in flight) nothing is written and the step fails with
/// `not_paying`.
fn confirm(
    d: PhaseDialect,
    i: &PaymentInput,
    now: i64,
    spec: onceflow_engine::StepSpec,
    charge_id: &str,
    response: &StoredResponse,
    not_paying: Failure,
) -> StatementPhase {
    let paying = d.wrote("p_order");
    let mut parts = d.write(
        "p_order",
        "UPDATE orders SET status = 'paid', version = version + 1, updated_at = $5 \
         WHERE tenant = $1 AND order_no = $2 AND status = 'paying' AND reserved_by = $3",
    );
    parts.extend(d.write(
        "p_record",
        &format!(
            "UPDATE payments SET status = 'succeeded', charge_id = $4, updated_at = $5 \
             WHERE tenant = $1 AND request_no = $3 AND token = $6 AND status = 'processing' AND {paying}"
        ),
    ));
    parts.extend(d.write(
        "p_token",
        &format!(
            "UPDATE idempotency_tokens SET state = 'completed', response_status = $8, response_body = $7, \
             updated_at = $5 WHERE token = $6 AND state = 'in_use' AND {paying}"
        ),
    ));
    let mut args = vec![
        SqlArg::Text(i.tenant.clone()),
        SqlArg::Text(i.order_no.as_str().to_owned()),
        SqlArg::Text(i.request_no.as_str().to_owned()),
        SqlArg::Text(charge_id.to_owned()),
        SqlArg::Int(now),
        SqlArg::Text(i.token.as_str().to_owned()),
        SqlArg::Text(response.body.clone()),
        SqlArg::Int(i64::from(response.status)),
        SqlArg::Text(serde_json::to_string(response).unwrap_or_default()),
    ];
    let paid = format!("{paying} AND {} AND {}", d.wrote("p_record"), d.wrote("p_token"));
    // The outbox: the payment's `payment.succeeded`, written only with the outcome (and once: its id is the
    // payment's). Not part of the guard: an event already there is no reason to refuse the outcome.
    let end = PaymentEnd::Succeeded { charge_id: charge_id.to_owned(), refunded: 0 };
    let event = outbox::phase_insert(&i.event(&end, now), &paid, &mut args);
    parts.extend(d.write("p_event", &event));
    StatementPhase::new(parts, args, vec![PhaseStep::new(spec, "$9")]).guard(paid, not_paying)
}
