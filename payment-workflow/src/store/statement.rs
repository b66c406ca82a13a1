//! The saga's two atomic phases as statement phases, on the backends that have them (Postgres, SQLite): each is
//! sent with its commit as one call (Postgres: one statement of data-modifying CTEs; SQLite: one multi-statement
//! call to the writer), so a payment's phase costs one round trip instead of a transaction of four to six. The
//! outputs are the JSON MySQL's closure steps store (`true`, `"Reserved"`, the stored response), so a
//! workflow's step rows read the same on every backend. The second phase writes the payment's event too (the
//! outbox: `events/outbox.rs`).

use std::sync::{Arc, OnceLock};

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

/// A step row's output expression (none for an intent) and the condition it is written under.
type StepSql = (Option<Arc<str>>, Option<Arc<str>>);

/// A phase's SQL in one dialect, the same for every payment: built once per dialect, shared by each payment's
/// phase (see [`PhaseStep`]), whose values are its arguments.
struct PhaseSql {
    parts: Arc<[String]>,
    /// Each step row's output expression (none for an intent) and condition, in the phase's order.
    outputs: Vec<StepSql>,
    guard: Arc<str>,
}

impl PhaseSql {
    /// The phase `build` makes in dialect `d`, built on first use and kept in `cells` (one per dialect).
    fn of(d: PhaseDialect, cells: &'static [OnceLock<Self>; 2], build: fn(PhaseDialect) -> Self) -> &'static Self {
        let cell = match d {
            PhaseDialect::Postgres => &cells[0],
            PhaseDialect::Sqlite => &cells[1],
        };
        cell.get_or_init(|| build(d))
    }

    /// The step of `spec` at `index` (a transactional step with its output, or an intent), with its condition.
    fn step(&self, index: usize, spec: impl Into<onceflow_engine::StepSpec>) -> PhaseStep {
        let (output, when) = &self.outputs[index];
        let step = match output {
            Some(output) => PhaseStep::new(spec, output.clone()),
            None => PhaseStep::intent(spec),
        };
        match when {
            Some(condition) => step.when(condition.clone()),
            None => step,
        }
    }
}

/// `claim_token`, `insert_record` (only once the token is claimed), `reserve_status` (only once the record
/// is inserted) and, once the order is reserved, the intent of the channel call `charge`. Unless the token is
/// claimed and the order exists nothing is written and `claim_token` fails with `not_claimed`.
fn reserve(d: PhaseDialect, i: &PaymentInput, now: i64, steps: ReserveSteps, not_claimed: Failure) -> StatementPhase {
    static SQL: [OnceLock<PhaseSql>; 2] = [OnceLock::new(), OnceLock::new()];
    let sql = PhaseSql::of(d, &SQL, reserve_sql);
    let ReserveSteps { claim, insert, reserve, charge } = steps;
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
    let steps = vec![sql.step(0, claim), sql.step(1, insert), sql.step(2, reserve), sql.step(3, charge)];
    StatementPhase::new(sql.parts.clone(), args, steps).guard(sql.guard.clone(), not_claimed)
}

/// [`reserve`]'s SQL in dialect `d`: parameters `$1…$9` are the token, tenant, fingerprint, route, now,
/// `request_no`, `order_no`, amount and currency; the fourth step is the intent.
fn reserve_sql(d: PhaseDialect) -> PhaseSql {
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
    // Amount and currency are never updated, so reading the order here (before the phase's writes on Postgres,
    // after them on SQLite) finds the same.
    let found = "EXISTS (SELECT 1 FROM orders WHERE tenant = $2 AND order_no = $7)";
    // As `Reserve` serializes; the same reading of the order as `Reserve::refused`.
    let reservation = format!(
        "CASE WHEN {reserved} THEN '\"Reserved\"' WHEN NOT {found} THEN '\"NotFound\"' \
         WHEN EXISTS (SELECT 1 FROM orders WHERE tenant = $2 AND order_no = $7 AND (amount <> $8 OR currency <> $9)) \
         THEN '\"Mismatch\"' ELSE '\"NotPayable\"' END"
    );
    let outputs = vec![
        (Some(Arc::from(format!("CASE WHEN {claimed} THEN 'true' ELSE 'false' END"))), None),
        (Some(Arc::from(format!("CASE WHEN {inserted} THEN 'true' ELSE 'false' END"))), None),
        (Some(Arc::from(reservation)), Some(Arc::from(inserted.as_str()))),
        (None, Some(Arc::from(reserved.as_str()))),
    ];
    // An unknown order is not stored either: the token stays unbound (a start that is the workflow's first
    // commit is refused). A reserved order exists: the lookup is left for the payments that did not reserve.
    let guard = format!("{claimed} AND ({reserved} OR {found})");
    PhaseSql { parts: parts.into(), outputs, guard: guard.into() }
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
    static SQL: [OnceLock<PhaseSql>; 2] = [OnceLock::new(), OnceLock::new()];
    let sql = PhaseSql::of(d, &SQL, confirm_sql);
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
    // The outbox: the payment's `payment.succeeded`, its values after the phase's own (`confirm_sql`).
    let end = PaymentEnd::Succeeded { charge_id: charge_id.to_owned(), refunded: 0 };
    outbox::phase_insert_args(&i.event(&end, now), &mut args);
    StatementPhase::new(sql.parts.clone(), args, vec![sql.step(0, spec)]).guard(sql.guard.clone(), not_paying)
}

/// Number of [`confirm`]'s own arguments, before the event's.
const CONFIRM_ARGS: usize = 9;

/// [`confirm`]'s SQL in dialect `d`: parameters `$1…$9` are the tenant, `order_no`, `request_no`, charge id,
/// now, token, the response's body and status and the stored response (the step's output), then the event's.
fn confirm_sql(d: PhaseDialect) -> PhaseSql {
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
    let paid = format!("{paying} AND {} AND {}", d.wrote("p_record"), d.wrote("p_token"));
    // The outbox: the payment's `payment.succeeded`, written only with the outcome (and once: its id is the
    // payment's). Not part of the guard: an event already there is no reason to refuse the outcome.
    parts.extend(d.write("p_event", &outbox::phase_insert_sql(CONFIRM_ARGS + 1, &paid)));
    PhaseSql { parts: parts.into(), outputs: vec![(Some(Arc::from("$9")), None)], guard: paid.into() }
}
