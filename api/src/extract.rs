//! A JSON body extractor whose rejections speak problem+json like every other error.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// `axum::Json`, with `415`, `413` and `400` answered as problems.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(rejection_to_problem(&rejection)),
        }
    }
}

pub(crate) fn rejection_to_problem(rejection: &JsonRejection) -> ApiError {
    match rejection.status() {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => unsupported_media_type(),
        StatusCode::PAYLOAD_TOO_LARGE => payload_too_large(),
        _ => ApiError::invalid(rejection.body_text()),
    }
}

pub(crate) fn unsupported_media_type() -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "Unsupported media type",
        "send the body as application/json",
    )
}

pub(crate) fn payload_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "Payload too large",
        "bodies are limited to 64 KiB",
    )
}
