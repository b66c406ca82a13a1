//! `Store::list` on MySQL / MariaDB: a page of workflows, newest first by `(created_at, workflow_id)`, every
//! filter in the query, read backwards through `workflows_tenant_page (tenant, created_at, workflow_id)` for a
//! tenant and `workflows_page (created_at, workflow_id)` otherwise (migration 0012). The cursor is written as
//! two ranges of the index (`created_at < ?`, or equal and `workflow_id < ?`): MySQL's range optimizer does not
//! turn a row comparison `(a, b) < (?, ?)` into one.

use sqlx::mysql::MySqlArguments;
use sqlx::{Arguments, MySql, MySqlPool};

use super::super::{WorkflowFilter, WorkflowRecord};
use crate::error::Result;

/// The page.
pub(super) async fn list(pool: &MySqlPool, filter: WorkflowFilter<'_>, limit: i64) -> Result<Vec<WorkflowRecord>> {
    let mut args = MySqlArguments::default();
    let mut conds = Vec::new();
    if let Some(tenant) = filter.tenant {
        args.add(tenant.to_owned()).map_err(sqlx::Error::Encode)?;
        conds.push("tenant = ?");
    }
    if let Some(name) = filter.name {
        args.add(name.to_owned()).map_err(sqlx::Error::Encode)?;
        conds.push("name = ?");
    }
    if let Some(state) = filter.state {
        args.add(state).map_err(sqlx::Error::Encode)?;
        conds.push("state = ?");
    }
    if let Some(after) = filter.after {
        args.add(after.created_at).map_err(sqlx::Error::Encode)?;
        args.add(after.created_at).map_err(sqlx::Error::Encode)?;
        args.add(after.workflow_id.clone()).map_err(sqlx::Error::Encode)?;
        conds.push("(created_at < ? OR (created_at = ? AND workflow_id < ?))");
    }
    args.add(limit).map_err(sqlx::Error::Encode)?;
    let filter = if conds.is_empty() { String::new() } else { format!(" WHERE {}", conds.join(" AND ")) };
    let sql = format!("SELECT * FROM workflows{filter} ORDER BY created_at DESC, workflow_id DESC LIMIT ?");
    Ok(sqlx::query_as_with::<MySql, WorkflowRecord, _>(sqlx::AssertSqlSafe(sql), args).fetch_all(pool).await?)
}
