//! The saga's two atomic phases as Postgres statement phases: each is sent with its commit as one statement
//! (data-modifying CTEs), so a payment's phase costs one round trip instead of a transaction of four to six.
//! The outputs are the JSON the closure steps store (`true`, `"Reserved"`, the stored response), so a
//! workflow's step rows read the same on every backend.

use onceflow_engine::{Failure, PhaseStep, SqlArg, StatementPhase, StepSpec};

use crate::model::StoredResponse;
use crate::saga::PaymentInput;

/// `claim_token`, `insert_record` (only once the token is claimed), `reserve_status` (only once the record
/// is inserted) and, once the order is reserved, the intent of the channel call `charge`. Unless the token is
/// claimed and the order exists nothing is written and `claim_token` fails with `not_claimed`.
pub(crate) fn reserve(
    i: &PaymentInput,
    now: i64,
    [claim, insert, reserve, charge]: [StepSpec; 4],
    not_claimed: Failure,
) -> StatementPhase {
    let ctes = vec![
        "p_token AS (UPDATE idempotency_tokens SET state = 'in_use', fingerprint = $3, route = $4, updated_at = $5 \
         WHERE token = $1 AND tenant = $2 AND state = 'issued' AND expires_at > $5 RETURNING 1)"
            .to_owned(),
        "p_record AS (INSERT INTO payments (tenant, request_no, order_no, amount, currency, status, token, \
         charge_id, decline_code, created_at, updated_at) \
         SELECT $2, $6, $7, $8, $9, 'processing', $1, NULL, NULL, $5, $5 WHERE EXISTS (SELECT 1 FROM p_token) \
         ON CONFLICT (tenant, request_no) DO NOTHING RETURNING 1)"
            .to_owned(),
        "p_order AS (UPDATE orders SET status = 'paying', version = version + 1, updated_at = $5 \
         WHERE tenant = $2 AND order_no = $7 AND status = 'pending' AND amount = $8 AND currency = $9 \
         AND EXISTS (SELECT 1 FROM p_record) RETURNING 1)"
            .to_owned(),
        "p_found AS (SELECT amount, currency FROM orders WHERE tenant = $2 AND order_no = $7)".to_owned(),
    ];
    let args = vec![
        SqlArg::Text(i.token.clone()),
        SqlArg::Text(i.tenant.clone()),
        SqlArg::Text(i.fingerprint.clone()),
        SqlArg::Text(i.route.clone()),
        SqlArg::Int(now),
        SqlArg::Text(i.request_no.clone()),
        SqlArg::Text(i.order_no.clone()),
        SqlArg::Int(i.amount),
        SqlArg::Text(i.currency.clone()),
    ];
    let claimed = "EXISTS (SELECT 1 FROM p_token)";
    let inserted = "EXISTS (SELECT 1 FROM p_record)";
    // As `Reserve` serializes; the same reading of the order as `Reserve::refused`.
    let reserved = "CASE WHEN EXISTS (SELECT 1 FROM p_order) THEN '\"Reserved\"' \
         WHEN NOT EXISTS (SELECT 1 FROM p_found) THEN '\"NotFound\"' \
         WHEN EXISTS (SELECT 1 FROM p_found WHERE amount <> $8 OR currency <> $9) THEN '\"Mismatch\"' \
         ELSE '\"NotPayable\"' END";
    let steps = vec![
        PhaseStep::new(claim, format!("CASE WHEN {claimed} THEN 'true' ELSE 'false' END")),
        PhaseStep::new(insert, format!("CASE WHEN {inserted} THEN 'true' ELSE 'false' END")),
        PhaseStep::new(reserve, reserved).when(inserted),
        PhaseStep::intent(charge).when("EXISTS (SELECT 1 FROM p_order)"),
    ];
    // An unknown order is not stored either: the token stays unbound (a start that is the workflow's first
    // commit is refused).
    let guard = format!("{claimed} AND EXISTS (SELECT 1 FROM p_found)");
    StatementPhase::new(ctes, args, steps).guard(guard, not_claimed)
}

/// `confirm`: order `paying → paid`, the record `succeeded` with `charge_id`, the token `completed` with the
/// 201 `response`, which is also the step's output. Unless the order was `paying` nothing is written and the
/// step fails with `not_paying`.
pub(crate) fn confirm(
    i: &PaymentInput,
    now: i64,
    spec: StepSpec,
    charge_id: &str,
    response: &StoredResponse,
    not_paying: Failure,
) -> StatementPhase {
    let ctes = vec![
        "p_order AS (UPDATE orders SET status = 'paid', version = version + 1, updated_at = $5 \
         WHERE tenant = $1 AND order_no = $2 AND status = 'paying' RETURNING 1)"
            .to_owned(),
        "p_record AS (UPDATE payments SET status = 'succeeded', charge_id = $4, updated_at = $5 \
         WHERE tenant = $1 AND request_no = $3 AND EXISTS (SELECT 1 FROM p_order) RETURNING 1)"
            .to_owned(),
        "p_token AS (UPDATE idempotency_tokens SET state = 'completed', response_status = $8, \
         response_body = $7, updated_at = $5 WHERE token = $6 AND EXISTS (SELECT 1 FROM p_order) RETURNING 1)"
            .to_owned(),
    ];
    let args = vec![
        SqlArg::Text(i.tenant.clone()),
        SqlArg::Text(i.order_no.clone()),
        SqlArg::Text(i.request_no.clone()),
        SqlArg::Text(charge_id.to_owned()),
        SqlArg::Int(now),
        SqlArg::Text(i.token.clone()),
        SqlArg::Text(response.body.clone()),
        SqlArg::Int(i64::from(response.status)),
        SqlArg::Text(serde_json::to_string(response).unwrap_or_default()),
    ];
    let paid = "EXISTS (SELECT 1 FROM p_order) AND EXISTS (SELECT 1 FROM p_record) AND EXISTS (SELECT 1 FROM p_token)";
    StatementPhase::new(ctes, args, vec![PhaseStep::new(spec, "$9")]).guard(paid, not_paying)
}
