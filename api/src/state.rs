//! What every request handler shares, and the tenant a request acts for.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use sha2::{Digest, Sha256};

use onceflow_payments::{PaymentStore, Payments};

use crate::error::ApiError;

/// The tenant of requests when no API keys are configured.
pub const DEFAULT_TENANT: &str = "default";

/// Shared state of the HTTP API: the payment service on the store `S` chosen at start-up.
pub struct AppState<S: PaymentStore> {
    /// The payment service.
    pub payments: Payments<S>,
    /// How requests are authenticated.
    pub auth: Auth,
    /// Default wait of `POST /v1/payments` for a final result.
    pub wait: Duration,
}

impl<S: PaymentStore> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self { payments: self.payments.clone(), auth: self.auth.clone(), wait: self.wait }
    }
}

/// How requests are authenticated.
#[derive(Clone)]
pub enum Auth {
    /// No keys: everything belongs to tenant `default`.
    SingleTenant,
    /// `Authorization: Bearer <key>`; keys are kept as SHA-256 digests and compared in constant time.
    Keys(Arc<Vec<(String, [u8; 32])>>),
}

impl Auth {
    /// Keys from `(tenant, key)` pairs.
    pub fn keys(pairs: Vec<(String, String)>) -> Self {
        Self::Keys(Arc::new(pairs.into_iter().map(|(t, k)| (t, digest(&k))).collect()))
    }

    fn tenant_for(&self, presented: Option<&str>) -> Option<String> {
        match self {
            Self::SingleTenant => Some(DEFAULT_TENANT.to_owned()),
            Self::Keys(keys) => {
                let presented = digest(presented?);
                // Every key is compared, in constant time, whatever matches.
                let mut found = None;
                for (tenant, key) in keys.iter() {
                    let diff = key.iter().zip(presented.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
                    if diff == 0 {
                        found = Some(tenant.clone());
                    }
                }
                found
            }
        }
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The tenant a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

impl<S: PaymentStore> FromRequestParts<AppState<S>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState<S>) -> Result<Self, Self::Rejection> {
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        state.auth.tenant_for(bearer).map(Tenant).ok_or_else(|| {
            ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized", "a valid API key is required")
        })
    }
}
