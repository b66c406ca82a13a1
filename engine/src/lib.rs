//! onceflow's durable-step engine.
//!
//! A workflow is a body of steps, each stored under a unique `(workflow_id, step_key)`. After a crash the body
//! is replayed: finished steps return their stored output, the rest run, so each transactional step commits
//! exactly once and each external step is told when an earlier attempt may have had its effect. Workers hold
//! workflows by leases with a fencing epoch checked by every commit; a recovery loop in any process resumes
//! what a dead one left. Compensations registered with their forward steps run in reverse on failure. Stores
//! exist for Postgres (many processes), MySQL / MariaDB (many processes) and SQLite (embedded); on Postgres and
//! SQLite a phase of transactional steps may also be given as SQL ([`phase::StatementPhase`]), sent with its
//! commit as one call.
//!
//! # Strata
//!
//! Each layer uses only the ones below it:
//!
//! ```text
//!  Engine            start, attach, wait; the recovery loop and     engine.rs, background.rs, ops.rs
//!    |               heartbeat; operator retry / cancel
//!  run               one run of one workflow: the body, then the     run.rs
//!    |               compensations; every way it stops
//!  WorkflowContext   the steps a body runs, their replay, statement  context/{steps,phase,commit}.rs
//!    |               phases, the fenced commit
//!  Core              what all runs share: store, clock, the leases   core.rs
//!    |               this process drives, waiters
//!  Store             one sealed trait, one folder per database       store/{postgres,sqlite,mysql}/
//! ```
//!
//! A workflow type implements [`Workflow`]; its body calls [`WorkflowContext::transactional`] and
//! [`WorkflowContext::external`]; an [`Engine`] over a [`Store`] runs it:
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
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod audit;
mod background;
pub mod clock;
mod config;
mod context;
mod core;
mod counts;
mod engine;
mod error;
mod history;
mod ops;
mod outcome;
pub mod phase;
mod retry;
mod run;
mod step;
pub mod store;
pub mod trace;
mod workflow;

pub use audit::{AuditAction, MAX_AUDIT};
pub use config::EngineConfig;
pub use context::WorkflowContext;
pub use counts::WorkflowCounts;
pub use engine::{Engine, EngineBuilder, Handle};
pub use error::{Error, Failure, Interrupt, Result, StepError};
pub use ops::{MAX_LIST, Woken, WorkflowView};
pub use outcome::Outcome;
pub use retry::RetryPolicy;
pub use step::{Attempt, BoxFuture, Previous, StepSpec, step};
pub use store::{Conn, Deleted, MySqlStore, PgStore, SqliteStore, Store};
pub use workflow::{Compensation, Workflow};
