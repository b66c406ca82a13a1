//! Errors of the payment service that are not business outcomes.

use std::time::Duration;

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
    #[error(transparent)]
    Invalid(#[from] crate::model::InvalidField),
    /// The order exists with other fields (`409 order_conflict`).
    #[error("order {0} exists with other fields")]
    OrderConflict(crate::model::OrderNo),
}

impl Error {
    /// Whether the same call may simply be made again: the database undid it for a deadlock or a lock-wait
    /// timeout, so nothing of it happened ([`onceflow_engine::store::is_transient`]).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database(e) | Self::Engine(onceflow_engine::Error::Database(e)) => {
                onceflow_engine::store::is_transient(e)
            }
            _ => false,
        }
    }
}

/// The payment service's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How many times a call is made again after a deadlock or a lock-wait timeout.
const TRANSIENT_TRIES: u32 = 5;

/// Runs `batch`, and again (a few times, a little later each time) when the database undid it for a deadlock or
/// a lock-wait timeout. A retention batch locks its rows in index order, a payment or a command's token in
/// primary-key order, so on MySQL the two can deadlock and the database undoes one of them: a pass that gave up
/// there would skip a whole interval, a command would go back to its queue.
pub(crate) async fn again_if_transient<T, F, Fut>(mut batch: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        match batch().await {
            Err(e) if e.is_transient() && tries < TRANSIENT_TRIES => {
                tries += 1;
                tracing::debug!(error = %e, tries, "undone by the database; trying it again");
                tokio::time::sleep(Duration::from_millis(10 * u64::from(tries))).await;
            }
            other => return other,
        }
    }
}

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
