//! The refund saga's two atomic phases as statement phases, on the backends that have them (Postgres, SQLite):
//! each is sent with its commit as one call, as the payment's are (`statement.rs`). The outputs are the JSON
//! MySQL's closure steps store, so a refund workflow's step rows read the same on every backend.
//!
//! Each phase is a list of writes, each guarded by the ones before it; the second one's last is the refund's
//! event (the outbox: `events/outbox.rs`).

use onceflow_engine::phase::{PhaseStep, SqlArg, StatementPhase};
use onceflow_engine::{Failure, Interrupt, StepSpec, Store, WorkflowContext};

use super::refund::{RefundPhase, RefundSteps};
use super::statement::{PhaseDialect, decode};
use crate::events::outbox;
use crate::model::{RefundInput, StoredResponse};

/// Runs phase 1 (see [`super::RefundStore::reserve_refund`]) as one statement phase in dialect `d`.
pub(super) async fn run_reserve<S: Store>(
    ctx: &mut WorkflowContext<S>,
    d: PhaseDialect,
    i: &RefundInput,
    now: i64,
    steps: RefundSteps,
    refused: Failure,
) -> Result<RefundPhase, Interrupt> {
    // Outputs: claimed (always, past the guard), recorded (or null), the reservation (once recorded), the intent.
    let outputs = ctx.statement_phase(reserve(d, i, now, steps, refused)).await?;
    let recorded = decode(outputs.get(1))?;
    let reserve = match outputs.get(2) {
        Some(Some(_)) => Some(decode(outputs.get(2))?),
        _ => None,
    };
    Ok(RefundPhase { recorded, reserve })
}

/// Runs phase 2 (see [`super::RefundStore::confirm_refund`]) in dialect `d`, written by the commit that completes
/// the workflow.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_confirm<S: Store>(
    ctx: &mut WorkflowContext<S>,
    d: PhaseDialect,
    i: &RefundInput,
    now: i64,
    spec: StepSpec,
    refund_id: &str,
    response: StoredResponse,
    not_processing: Failure,
) -> Result<StoredResponse, Interrupt> {
    let phase = confirm(d, i, now, spec, refund_id, &response, not_processing);
    ctx.finish_with(phase, response).await
}

/// `claim_token`; `insert_refund` (once the token is claimed: the refund, `processing`, with its payment's order
/// and currency; the output is what was recorded, or `null` when the `refund_no` is another refund's);
/// `reserve_amount` (once recorded: one conditional update of the payment, rows affected telling); and, once
/// reserved, the intent of the channel call. Unless the token is claimed and the tenant has the payment, nothing
/// is written and `claim_token` fails with `not_claimed`.
fn reserve(d: PhaseDialect, i: &RefundInput, now: i64, steps: RefundSteps, not_claimed: Failure) -> StatementPhase {
    let RefundSteps { claim, insert, reserve, call } = steps;
    let (claimed, recorded, reserved) = (d.wrote("r_token"), d.wrote("r_refund"), d.wrote("r_reserve"));
    let mut parts = d.write(
        "r_token",
        "UPDATE idempotency_tokens SET state = 'in_use', fingerprint = $3, route = $4, updated_at = $5 \
         WHERE token = $1 AND tenant = $2 AND state = 'issued' AND expires_at > $5",
    );
    // No conflict target: a `refund_no` in use (or, which follows from it, its channel number) is "recorded
    // before", never an error.
    parts.extend(d.write(
        "r_refund",
        &format!(
            "INSERT INTO refunds (tenant, refund_no, request_no, order_no, amount, currency, status, reason, token, \
             merchant_refund_no, refund_id, created_at, updated_at) \
             SELECT $2, $6, $7, p.order_no, $8, p.currency, 'processing', CASE WHEN $11 <> 0 THEN $9 END, $1, $10, \
             NULL, $5, $5 FROM payments p WHERE p.tenant = $2 AND p.request_no = $7 AND {claimed} \
             ON CONFLICT DO NOTHING"
        ),
    ));
    // The reservation: one conditional update, whose condition is the whole rule (the database re-checks it on
    // the row as the last concurrent refund left it).
    parts.extend(d.write(
        "r_reserve",
        &format!(
            "UPDATE payments SET refund_reserved = refund_reserved + $8, updated_at = $5 \
             WHERE tenant = $2 AND request_no = $7 AND status = 'succeeded' \
             AND $8 <= amount - refunded_amount - refund_reserved AND {recorded}"
        ),
    ));
    let args = vec![
        SqlArg::Text(i.token.as_str().to_owned()),
        SqlArg::Text(i.tenant.clone()),
        SqlArg::Text(i.fingerprint.clone()),
        SqlArg::Text(i.route.clone()),
        SqlArg::Int(now),
        SqlArg::Text(i.refund_no.as_str().to_owned()),
        SqlArg::Text(i.request_no.as_str().to_owned()),
        SqlArg::Int(i.amount),
        SqlArg::Text(i.reason.clone().unwrap_or_default()),
        SqlArg::Text(i.merchant_refund_no.clone()),
        // Whether there is a reason (a statement phase binds no NULL; an empty reason is a reason).
        SqlArg::Int(i64::from(i.reason.is_some())),
    ];
    let payment = "FROM payments p WHERE p.tenant = $2 AND p.request_no = $7";
    // What was recorded, as `RefundRecorded` reads it: the payment's order and currency never change, so reading
    // them here (before the phase's writes on Postgres, after them on SQLite) finds the same.
    let recorded_json = match d {
        PhaseDialect::Postgres => format!(
            "(SELECT json_build_object('created_at', $5::bigint, 'currency', p.currency, 'order_no', p.order_no)::text \
             {payment})"
        ),
        PhaseDialect::Sqlite => {
            format!("(SELECT json_object('created_at', $5, 'currency', p.currency, 'order_no', p.order_no) {payment})")
        }
    };
    // As `RefundReserve` serializes. A payment that is not `succeeded` cannot be refunded at all; one that is
    // has too little left.
    let reservation = format!(
        "CASE WHEN {reserved} THEN '\"Reserved\"' \
         WHEN EXISTS (SELECT 1 {payment} AND p.status = 'succeeded') THEN '\"Exceeds\"' \
         ELSE '\"NotRefundable\"' END"
    );
    let steps = vec![
        PhaseStep::new(claim, format!("CASE WHEN {claimed} THEN 'true' ELSE 'false' END")),
        PhaseStep::new(insert, format!("CASE WHEN {recorded} THEN {recorded_json} ELSE 'null' END")),
        PhaseStep::new(reserve, reservation).when(recorded),
        PhaseStep::intent(call).when(reserved),
    ];
    // Another tenant's payment, or none: nothing is stored and the token stays usable (a refused first commit
    // refuses the start).
    let guard = format!("{claimed} AND EXISTS (SELECT 1 {payment})");
    StatementPhase::new(parts, args, steps).guard(guard, not_claimed)
}

/// `confirm_refund`: the refund `succeeded` with `refund_id`; its payment's reservation moved to refunded; the
/// order `paid → refunded` if the payment's refunds now cover it; the token `completed` with the 201
/// `response`, which is also the step's output. Unless the refund was `processing` under this token nothing is
/// written and the step fails with `not_processing`.
fn confirm(
    d: PhaseDialect,
    i: &RefundInput,
    now: i64,
    spec: StepSpec,
    refund_id: &str,
    response: &StoredResponse,
    not_processing: Failure,
) -> StatementPhase {
    let (ended, moved) = (d.wrote("r_refund"), d.wrote("r_payment"));
    let mut parts = d.write(
        "r_refund",
        "UPDATE refunds SET status = 'succeeded', refund_id = $4, updated_at = $5 \
         WHERE tenant = $1 AND refund_no = $2 AND token = $6 AND status = 'processing'",
    );
    let move_amount = format!(
        "UPDATE payments SET refund_reserved = refund_reserved - $7, refunded_amount = refunded_amount + $7, \
         updated_at = $5 WHERE tenant = $1 AND request_no = $3 AND {ended}"
    );
    // The order is refunded once this payment — the one whose charge the order kept (`reserved_by`; NULL for an
    // order paid before that column) — has given back its whole amount. Read from the payment as this phase
    // left it: on Postgres, from what its update returned (the row as the last concurrent refund left it, which
    // the statement's snapshot may predate); on SQLite, after it.
    let order = "UPDATE orders SET status = 'refunded', version = version + 1, updated_at = $5 \
                 WHERE tenant = $1 AND status = 'paid' AND (reserved_by = $3 OR reserved_by IS NULL)";
    match d {
        PhaseDialect::Postgres => {
            parts.push(format!("r_payment AS ({move_amount} RETURNING order_no, amount, refunded_amount)"));
            parts.push(format!(
                "r_order AS ({order} AND order_no = (SELECT order_no FROM r_payment WHERE refunded_amount >= amount) \
                 RETURNING 1)"
            ));
        }
        PhaseDialect::Sqlite => {
            parts.extend(d.write("r_payment", &move_amount));
            parts.extend(d.write(
                "r_order",
                &format!(
                    "{order} AND {moved} AND order_no = (SELECT order_no FROM payments \
                     WHERE tenant = $1 AND request_no = $3 AND refunded_amount >= amount)"
                ),
            ));
        }
    }
    parts.extend(d.write(
        "r_token",
        &format!(
            "UPDATE idempotency_tokens SET state = 'completed', response_status = $9, response_body = $8, \
             updated_at = $5 WHERE token = $6 AND state = 'in_use' AND {ended}"
        ),
    ));
    let mut args = vec![
        SqlArg::Text(i.tenant.clone()),
        SqlArg::Text(i.refund_no.as_str().to_owned()),
        SqlArg::Text(i.request_no.as_str().to_owned()),
        SqlArg::Text(refund_id.to_owned()),
        SqlArg::Int(now),
        SqlArg::Text(i.token.as_str().to_owned()),
        SqlArg::Int(i.amount),
        SqlArg::Text(response.body.clone()),
        SqlArg::Int(i64::from(response.status)),
        SqlArg::Text(serde_json::to_string(response).unwrap_or_default()),
    ];
    let confirmed = format!("{ended} AND {moved} AND {}", d.wrote("r_token"));
    // The outbox: the refund's `refund.succeeded`, written only with the outcome (and once: its id is the
    // refund's). Not part of the guard: an event already there is no reason to refuse the outcome.
    let event = outbox::phase_insert(&i.succeeded_event(response, now), &confirmed, &mut args);
    parts.extend(d.write("r_event", &event));
    StatementPhase::new(parts, args, vec![PhaseStep::new(spec, "$10")]).guard(confirmed, not_processing)
}
