//! `Store::list` on Postgres: a page of workflows, newest first by `(created_at, workflow_id)`, every filter in
//! the query.
//!
//! A tenant's page reads `workflows_tenant_page (tenant, created_at, workflow_id)` (migration 0012) backwards
//! from the cursor, for the rows it returns. With a state too, the state is a filter on that range (or the
//! planner reads the state's range of `workflows_state` and filters the tenant): a state the tenant has few
//! workflows in reads past the others', as no index leads with both.
//!
//! Every tenant's page has no index of its own on Postgres (building one would take a third `CONCURRENTLY`
//! migration); it is the merge (Merge Append) of one branch per state, each reading `workflows_state (state,
//! created_at)` backwards from the cursor and sorting only the rows of one millisecond by id (Incremental Sort):
//! measured over 200,000 workflows, 22 index rows for a page of 21, never the table. (On a near-empty table the
//! planner sorts a branch's few rows whole instead, which costs nothing there.)

use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgPool, Postgres};

use super::super::{WorkflowFilter, WorkflowRecord, WorkflowState};
use crate::error::Result;

/// The page's query and its arguments.
pub(super) fn list_query(filter: WorkflowFilter<'_>, limit: i64) -> Result<(String, PgArguments)> {
    let mut args = PgArguments::default();
    let mut conds = Vec::new();
    if let Some(tenant) = filter.tenant {
        args.add(tenant.to_owned()).map_err(sqlx::Error::Encode)?;
        conds.push(format!("tenant = ${}", args.len()));
    }
    if let Some(name) = filter.name {
        args.add(name.to_owned()).map_err(sqlx::Error::Encode)?;
        conds.push(format!("name = ${}", args.len()));
    }
    if let Some(after) = filter.after {
        args.add(after.created_at).map_err(sqlx::Error::Encode)?;
        args.add(after.workflow_id.clone()).map_err(sqlx::Error::Encode)?;
        conds.push(format!("(created_at, workflow_id) < (${}, ${})", args.len() - 1, args.len()));
    }
    args.add(limit).map_err(sqlx::Error::Encode)?;
    let limit = format!("${}", args.len());
    let order = "ORDER BY created_at DESC, workflow_id DESC";
    // A state is written as a literal, its text: each branch's plan is that state's range of the index (and a
    // state is one of the engine's own, so nothing from the caller is spliced into the SQL).
    let page = |state: Option<WorkflowState>| {
        let mut conds = conds.clone();
        conds.extend(state.map(|s| format!("state = '{}'", s.as_str())));
        let filter = if conds.is_empty() { String::new() } else { format!(" WHERE {}", conds.join(" AND ")) };
        format!("SELECT * FROM workflows{filter} {order} LIMIT {limit}")
    };
    let sql = if filter.tenant.is_some() || filter.state.is_some() {
        page(filter.state)
    } else {
        let branches: Vec<String> = WorkflowState::ALL.iter().map(|s| format!("({})", page(Some(*s)))).collect();
        format!("SELECT * FROM ({}) page {order} LIMIT {limit}", branches.join(" UNION ALL "))
    };
    Ok((sql, args))
}

/// The page.
pub(super) async fn list(pool: &PgPool, filter: WorkflowFilter<'_>, limit: i64) -> Result<Vec<WorkflowRecord>> {
    let (sql, args) = list_query(filter, limit)?;
    Ok(sqlx::query_as_with::<Postgres, WorkflowRecord, _>(sqlx::AssertSqlSafe(sql), args).fetch_all(pool).await?)
}
