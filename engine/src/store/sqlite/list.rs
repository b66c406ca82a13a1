//! `Store::list` on SQLite: a page of workflows, newest first by `(created_at, workflow_id)`, every filter in
//! the query, read backwards through `workflows_tenant_page (tenant, created_at, workflow_id)` for a tenant and
//! `workflows_page (created_at, workflow_id)` otherwise (migration 0012). The cursor is a row value, which
//! SQLite turns into the index range (sqlite.org/rowvalue.html, "scrolling window queries").

use sqlx::sqlite::SqliteArguments;
use sqlx::{Arguments, Sqlite, SqlitePool};

use super::super::{WorkflowFilter, WorkflowRecord};
use crate::error::Result;

/// The page.
pub(super) async fn list(pool: &SqlitePool, filter: WorkflowFilter<'_>, limit: i64) -> Result<Vec<WorkflowRecord>> {
    let mut args = SqliteArguments::default();
    let mut conds = Vec::new();
    if let Some(tenant) = filter.tenant {
        args.add(tenant.to_owned()).map_err(sqlx::Error::Encode)?;
        conds.push(format!("tenant = ${}", args.len()));
    }
    if let Some(name) = filter.name {
        args.add(name.to_owned()).map_err(sqlx::Error::Encode)?;
        conds.push(format!("name = ${}", args.len()));
    }
    if let Some(state) = filter.state {
        args.add(state).map_err(sqlx::Error::Encode)?;
        conds.push(format!("state = ${}", args.len()));
    }
    if let Some(after) = filter.after {
        args.add(after.created_at).map_err(sqlx::Error::Encode)?;
        args.add(after.workflow_id.clone()).map_err(sqlx::Error::Encode)?;
        conds.push(format!("(created_at, workflow_id) < (${}, ${})", args.len() - 1, args.len()));
    }
    args.add(limit).map_err(sqlx::Error::Encode)?;
    let filter = if conds.is_empty() { String::new() } else { format!(" WHERE {}", conds.join(" AND ")) };
    let sql =
        format!("SELECT * FROM workflows{filter} ORDER BY created_at DESC, workflow_id DESC LIMIT ${}", args.len());
    Ok(sqlx::query_as_with::<Sqlite, WorkflowRecord, _>(sqlx::AssertSqlSafe(sql), args).fetch_all(pool).await?)
}
