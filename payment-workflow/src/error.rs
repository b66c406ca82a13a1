//! Errors of the payment service that are not business outcomes.

/// Something kept the payment service from answering.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database failed or could not be reached: answer `503` and let the client retry.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A request field is invalid (`400`, not stored).
    #[error("{0}")]
    Invalid(String),
    /// The order exists with other fields (`409 order_conflict`).
    #[error("order {0} exists with other fields")]
    OrderConflict(String),
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Self::Unavailable(e.to_string())
    }
}

impl From<onceflow_engine::Error> for Error {
    fn from(e: onceflow_engine::Error) -> Self {
        Self::Unavailable(e.to_string())
    }
}

/// The payment service's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
