//! The audit log's SQL on MySQL / MariaDB (`?` parameters).

use sqlx::MySql;

use super::super::{AuditFilter, AuditRecord};
use crate::error::Result;

const INSERT: &str = "INSERT INTO audit_log (id, at, actor, action, workflow_id, subject, tenant, reason, status, \
    result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const FINISH: &str = "UPDATE audit_log SET status = ?, result = ? WHERE id = ?";
/// A workflow's entries, oldest first, through `audit_log_workflow`.
const OF_WORKFLOW: &str =
    "SELECT * FROM audit_log WHERE workflow_id = ? AND (? IS NULL OR tenant = ?) ORDER BY at, id LIMIT ?";
/// The newest entries, through `audit_log_at`.
const NEWEST: &str = "SELECT * FROM audit_log WHERE (? IS NULL OR tenant = ?) ORDER BY at DESC, id DESC LIMIT ?";

pub(super) async fn insert(pool: &sqlx::Pool<MySql>, r: &AuditRecord) -> Result<()> {
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

pub(super) async fn finish(pool: &sqlx::Pool<MySql>, id: &str, status: i32, result: &str) -> Result<()> {
    sqlx::query(FINISH).bind(status).bind(result).bind(id).execute(pool).await?;
    Ok(())
}

pub(super) async fn read(pool: &sqlx::Pool<MySql>, f: AuditFilter<'_>) -> Result<Vec<AuditRecord>> {
    Ok(match f.workflow_id {
        Some(id) => {
            let q = sqlx::query_as(OF_WORKFLOW).bind(id).bind(f.tenant).bind(f.tenant).bind(f.limit);
            q.fetch_all(pool).await?
        }
        None => sqlx::query_as(NEWEST).bind(f.tenant).bind(f.tenant).bind(f.limit).fetch_all(pool).await?,
    })
}
