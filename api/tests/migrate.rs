//! Migrations as a rolling deploy meets them, on Postgres (and MySQL): processes that start together (every `serve`,
//! `worker` and `consume` migrates at start-up) all start, while one of them builds the indexes made
//! `CONCURRENTLY`; and an index build that died half-way (a process killed during it) is built again by the next
//! start rather than kept broken or failing every start after it.

use std::process::Command;

use sqlx::{Connection, PgConnection};

const ONCEFLOW: &str = env!("CARGO_BIN_EXE_onceflow");

/// A new, empty database on the server of `DATABASE_URL`.
async fn empty_database() -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let name = format!("onceflow_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&base).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut admin).await.unwrap();
    let (server, _) = base.rsplit_once('/').unwrap();
    format!("{server}/{name}")
}

/// A new, empty database on the server of `MYSQL_URL`.
async fn empty_mysql_database() -> String {
    let base = std::env::var("MYSQL_URL").expect("MYSQL_URL");
    let name = format!("onceflow_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::MySqlConnection::connect(&base).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut admin).await.unwrap();
    let (server, _) = base.rsplit_once('/').unwrap();
    format!("{server}/{name}")
}

fn migrate(url: &str) -> std::process::Child {
    Command::new(ONCEFLOW).args(["migrate", "--database-url", url]).spawn().unwrap()
}

/// The indexes of the database at `url` that Postgres will not use (a concurrent build that failed).
async fn invalid_indexes(conn: &mut PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE NOT i.indisvalid",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test]
async fn processes_that_start_together_all_migrate() {
    for round in 0..3 {
        let url = empty_database().await;
        let mut processes: Vec<_> = (0..3).map(|_| migrate(&url)).collect();
        for (i, p) in processes.iter_mut().enumerate() {
            assert!(p.wait().unwrap().success(), "round {round}: process {i} could not migrate");
        }
        let mut conn = PgConnection::connect(&url).await.unwrap();
        assert_eq!(invalid_indexes(&mut conn).await, Vec::<String>::new(), "round {round}");
        let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE NOT success")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(failed, 0, "round {round}");
    }
}

/// The same on MySQL / MariaDB, where sqlx's own migration lock is not taken at all (`GET_LOCK(…, -1)` is `NULL`
/// on MariaDB): processes started together applied the same migration at once.
#[cfg_attr(onceflow_no_mysql, ignore = "MYSQL_URL is not set")]
#[tokio::test]
async fn processes_that_start_together_all_migrate_mysql() {
    for round in 0..3 {
        let url = empty_mysql_database().await;
        let mut processes: Vec<_> = (0..3).map(|_| migrate(&url)).collect();
        for (i, p) in processes.iter_mut().enumerate() {
            assert!(p.wait().unwrap().success(), "round {round}: process {i} could not migrate");
        }
    }
}

#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test]
async fn an_index_build_that_died_is_built_again() {
    let url = empty_database().await;
    assert!(migrate(&url).wait().unwrap().success());
    let mut conn = PgConnection::connect(&url).await.unwrap();
    // Two rows in each table, so that a unique index over a constant cannot be built.
    sqlx::raw_sql(
        "INSERT INTO workflows (workflow_id, name, input, input_hash, state, next_attempt_at, created_at, updated_at) \
         VALUES ('a', 'x', '{}', 'h', 'completed', 0, 0, 0), ('b', 'x', '{}', 'h', 'completed', 0, 0, 0); \
         INSERT INTO idempotency_tokens (token, tenant, state, created_at, expires_at, updated_at) \
         VALUES ('a', 't', 'issued', 0, 0, 0), ('b', 't', 'issued', 0, 0, 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    // What a build whose process died leaves: the index under its name on its table, its migration unrecorded.
    // 0009 and 0010 INVALID (the build stopped half-way: a unique build over duplicates fails the same way);
    // 0012 valid (the server finished the build after the process was gone, before the history row).
    let leftovers = [
        (9, "workflows_finished", "CREATE UNIQUE INDEX CONCURRENTLY workflows_finished ON workflows ((1))"),
        (10, "tokens_unused", "CREATE UNIQUE INDEX CONCURRENTLY tokens_unused ON idempotency_tokens ((1))"),
        (12, "workflows_tenant_page", "CREATE INDEX CONCURRENTLY workflows_tenant_page ON workflows (tenant)"),
    ];
    for (version, index, create) in leftovers {
        // Separate statements: CONCURRENTLY cannot run inside the implicit transaction of one call.
        let drop = format!("DROP INDEX {index}");
        let forget = format!("DELETE FROM _sqlx_migrations WHERE version = {version}");
        for statement in [drop, forget, create.to_owned()] {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(statement)).execute(&mut conn).await;
        }
    }
    let mut invalid = invalid_indexes(&mut conn).await;
    invalid.sort();
    assert_eq!(invalid, ["tokens_unused", "workflows_finished"]);

    assert!(migrate(&url).wait().unwrap().success(), "the next start migrates");
    assert_eq!(invalid_indexes(&mut conn).await, Vec::<String>::new());
    for (_, index, _) in leftovers {
        let definition: String = sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = $1")
            .bind(index)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(!definition.contains("UNIQUE") && !definition.ends_with("(tenant)"), "{index}: {definition}");
    }
    let versions: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE version IN (9, 10, 12)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(versions, 3);
}
