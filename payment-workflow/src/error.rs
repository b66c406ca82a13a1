//! Errors of the payment service that are not business outcomes.

/// Something kept the payment service from answering.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database failed or could not be reached: answer `503` and let the client retry.
    #[error("storage unavailable")]
    Database(#[from] sqlx::Error),
    /// The engine could not run or read the payment's workflow (the database, a shutdown): answer `503`.
    #[error("the payment engine could not answer")]
    Engine(#[from] onceflow_engine::Error),
    /// Storage answered something it should not have (a row gone that was just written): answer `503`.
    #[error("storage unavailable: {0}")]
    Unavailable(&'static str),
    /// A request field is invalid (`400`, not stored).
    #[error("{0}")]
    Invalid(String),
    /// The order exists with other fields (`409 order_conflict`).
    #[error("order {0} exists with other fields")]
    OrderConflict(String),
}

/// The payment service's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::Error;

    #[test]
    fn a_storage_failure_keeps_its_cause() {
        let e = Error::from(sqlx::Error::PoolTimedOut);
        assert!(matches!(e.source().and_then(|s| s.downcast_ref::<sqlx::Error>()), Some(sqlx::Error::PoolTimedOut)));
        let e = Error::from(onceflow_engine::Error::ShuttingDown);
        assert!(e.source().is_some(), "the engine's error is the source, not flattened into a string");
    }
}
