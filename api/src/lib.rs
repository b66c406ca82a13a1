//! onceflow's HTTP API and command line: the contract of `contracts/http-api.md` and `contracts/cli.md` over the
//! payment service. [`app`] builds the router, so tests start the real application on port 0.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::{sync::Arc, time::Duration};
//! use onceflow_api::{AppState, Auth, app};
//! use onceflow_engine::SqliteStore;
//! use onceflow_payments::{MockChannel, PaymentStore, Payments};
//!
//! let store = SqliteStore::connect("sqlite://demo.db").await?;
//! store.migrate_payments().await?;
//! let payments = Payments::new(store, Arc::new(MockChannel::reliable()), Default::default());
//! payments.engine().spawn_background();
//! let wait = Duration::from_secs(10);
//! let state = AppState { payments, auth: Auth::SingleTenant, wait, body_read_timeout: wait, mock_channel: true };
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, app(state)).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod app;
pub mod config;
mod console;
mod consume;
mod database;
mod error;
mod events;
mod extract;
mod gc;
pub mod metrics;
mod openapi;
mod operate;
mod reconcile;
mod routes;
mod run;
mod server;
mod state;
pub mod telemetry;
mod text;

pub use app::app;
pub use database::{OnPayments, Pool, redact, with_payments, with_payments_on};
pub use error::ApiError;
pub use openapi::ApiDoc;
pub use routes::BODY_LIMIT;
pub use run::{run, shutdown_signal};
pub use state::{AppState, Auth, Caller, DEFAULT_TENANT, Keys, Tenant};
