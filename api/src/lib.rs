//! onceflow's HTTP API and command line: the contract of `contracts/http-api.md` and `contracts/cli.md` over the
//! payment service. [`app`] builds the router, so tests start the real application on port 0.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::{sync::Arc, time::Duration};
//! use onceflow_api::{AppState, Auth, Backend, app};
//! use onceflow_payments::MockChannel;
//!
//! let backend = Backend::connect("sqlite://demo.db", Arc::new(MockChannel::reliable()), Default::default(), 8).await?;
//! let state = AppState { backend, auth: Auth::SingleTenant, wait: Duration::from_secs(10) };
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, app(state)).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod backend;
pub mod config;
mod consume;
mod error;
mod extract;
pub mod metrics;
mod openapi;
mod routes;
mod run;
mod state;

pub use backend::{Backend, redact};
pub use error::ApiError;
pub use openapi::ApiDoc;
pub use routes::{BODY_LIMIT, app};
pub use run::{run, shutdown_signal};
pub use state::{AppState, Auth, DEFAULT_TENANT, Tenant};
