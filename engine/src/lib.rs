//! onceflow's durable-step engine.
//!
//! A workflow is a body of steps, each stored under a unique `(workflow_id, step_key)`. After a crash the body
//! is replayed: finished steps return their stored output, the rest run, so each transactional step commits
//! exactly once and each external step is told when an earlier attempt may have had its effect. Workers hold
//! workflows by leases with a fencing epoch checked by every commit; a recovery loop in any process resumes
//! what a dead one left. Compensations registered before their forward steps run in reverse on failure.
//! Stores exist for Postgres (many processes), MySQL / MariaDB (many processes) and SQLite (embedded).
//! On Postgres a phase may also be given as one SQL statement ([`StatementPhase`]), sent with its commit in a
//! single round trip.
//!
//! ```no_run
//! use onceflow_engine::{BoxFuture, Engine, Interrupt, SqliteStore, Store, Workflow, WorkflowContext};
//! use std::time::Duration;
//!
//! struct Greet;
//!
//! impl Workflow<SqliteStore> for Greet {
//!     const NAME: &'static str = "greet";
//!     type Input = String;
//!     type Output = String;
//!
//!     async fn run(&self, ctx: &mut WorkflowContext<SqliteStore>, name: String) -> Result<String, Interrupt> {
//!         ctx.transactional("remember", |conn| -> BoxFuture<'_, _> {
//!             Box::pin(async move {
//!                 sqlx::query("SELECT 1").execute(conn).await?;
//!                 Ok(())
//!             })
//!         })
//!         .await?;
//!         ctx.external("greet", |_attempt| async { Ok(format!("hello {name}")) }).await
//!     }
//! }
//!
//! # async fn demo() -> Result<(), onceflow_engine::Error> {
//! let store = SqliteStore::connect("sqlite://demo.db").await?;
//! store.migrate().await?;
//! let engine = Engine::builder(store).register(Greet).build();
//! let handle = engine.start::<Greet>("greet-1", &"ada".to_owned()).await?;
//! let outcome = handle.wait(Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod background;
mod clock;
mod config;
mod context;
mod core;
mod engine;
mod error;
mod ops;
mod outcome;
mod phase;
mod retry;
mod run;
mod step;
mod store;
mod workflow;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::EngineConfig;
pub use context::WorkflowContext;
pub use engine::{Engine, EngineBuilder, Handle};
pub use error::{CANCELLED_CODE, Error, Failure, Interrupt, Result, StepError, is_transient};
pub use ops::WorkflowView;
pub use outcome::Outcome;
pub use phase::{PhaseCommit, PhaseRow, PhaseStep, SqlArg, StatementPhase};
pub use retry::RetryPolicy;
pub use step::{Attempt, BoxFuture, Previous, StepSpec, step};
pub use store::{
    Checkpoint, Committed, CompensationRecord, Conn, Fence, Listener, MYSQL_MIGRATOR, MySqlStore, POSTGRES_MIGRATOR,
    PgStore, Reopen, SQLITE_MIGRATOR, SQLITE_PHASE_FLAGS, SqliteStore, StepRecord, Store, Tx, WorkflowRecord,
    WorkflowUpdate, WorkflowWrite, compensation_status, kind, state, step_status,
};
pub use workflow::{Compensation, Workflow};
