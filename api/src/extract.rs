//! A JSON body extractor whose rejections speak problem+json like every other error.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::Deserialize;
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

/// An integer field as JSON means it: `1000` and `1000.0` are the same number (as JSON Schema's `integer` says),
/// a fraction or a number outside `i64` is not an integer.
pub(crate) fn integral<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    if let Some(i) = n.as_i64() {
        return Ok(i);
    }
    match n.as_f64() {
        // Past 2^53 a float no longer names one integer.
        Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => Ok(f as i64),
        _ => Err(serde::de::Error::custom(format!("invalid type: {n}, expected an integer"))),
    }
}
