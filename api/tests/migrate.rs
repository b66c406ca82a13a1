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
    // Each index built CONCURRENTLY, as a killed build leaves it: present under its name, INVALID, and its
    // migration not recorded. (A unique build over duplicates fails the same way a killed one does.)
    sqlx::raw_sql("CREATE TABLE scratch (x int); INSERT INTO scratch VALUES (1), (1)")
        .execute(&mut conn)
        .await
        .unwrap();
    let built = [(9, "workflows_finished"), (10, "tokens_retention"), (12, "workflows_tenant_page")];
    for (version, index) in built {
        let sql = format!(
            "DROP INDEX {index}; DELETE FROM _sqlx_migrations WHERE version = {version}; \
             CREATE UNIQUE INDEX CONCURRENTLY {index} ON scratch (x)"
        );
        // Run as separate statements: CONCURRENTLY cannot run inside the implicit transaction of one call.
        for statement in sql.split("; ") {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned())).execute(&mut conn).await;
        }
    }
    let mut invalid = invalid_indexes(&mut conn).await;
    invalid.sort();
    assert_eq!(invalid, ["tokens_retention", "workflows_finished", "workflows_tenant_page"]);

    assert!(migrate(&url).wait().unwrap().success(), "the next start migrates");
    assert_eq!(invalid_indexes(&mut conn).await, Vec::<String>::new());
    for (_, index) in built {
        let table: String = sqlx::query_scalar("SELECT tablename::text FROM pg_indexes WHERE indexname = $1")
            .bind(index)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_ne!(table, "scratch", "{index} is built on its table again");
    }
}
