//! The audit log's SQL on this backend (`$n` parameters).

use super::super::{AuditFilter, AuditRecord};
use crate::error::Result;

const INSERT: &str = "INSERT INTO audit_log (id, at, actor, action, workflow_id, subject, tenant, reason, status, \
    result) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
const FINISH: &str = "UPDATE audit_log SET status = $2, result = $3 WHERE id = $1";
/// A workflow's entries, oldest first, through `audit_log_workflow`.
const OF_WORKFLOW: &str = "SELECT * FROM audit_log WHERE workflow_id = $1 AND ($2 IS NULL OR tenant = $2) \
    ORDER BY at, id LIMIT $3";
/// The newest entries, through `audit_log_at`.
const NEWEST: &str = "SELECT * FROM audit_log WHERE ($1 IS NULL OR tenant = $1) ORDER BY at DESC, id DESC LIMIT $2";

pub(super) async fn insert(pool: &sqlx::Pool<sqlx::Sqlite>, r: &AuditRecord) -> Result<()> {
    sqlx::query(INSERT)
        .bind(&r.id)
        .bind(r.at)
        .bind(&r.actor)
        .bind(&r.action)
        .bind(&r.workflow_id)
        .bind(&r.subject)
        .bind(&r.tenant)
        .bind(&r.reason)
        .bind(r.status)
        .bind(&r.result)
        .execute(pool)
        .await?;
    Ok(())
}

pub(super) async fn finish(pool: &sqlx::Pool<sqlx::Sqlite>, id: &str, status: i32, result: &str) -> Result<()> {
    sqlx::query(FINISH).bind(id).bind(status).bind(result).execute(pool).await?;
    Ok(())
}

pub(super) async fn read(pool: &sqlx::Pool<sqlx::Sqlite>, f: AuditFilter<'_>) -> Result<Vec<AuditRecord>> {
    Ok(match f.workflow_id {
        Some(id) => sqlx::query_as(OF_WORKFLOW).bind(id).bind(f.tenant).bind(f.limit).fetch_all(pool).await?,
        None => sqlx::query_as(NEWEST).bind(f.tenant).bind(f.limit).fetch_all(pool).await?,
    })
}
