//! What every request handler shares, and the tenant a request acts for.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
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
    /// How long a request's body may take to arrive once its headers are in (`408` after that).
    pub body_read_timeout: Duration,
    /// Whether payments are charged to the in-process mock channel (every charge succeeds, no money moves):
    /// `/readyz` says so.
    pub mock_channel: bool,
}

impl<S: PaymentStore> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self {
            payments: self.payments.clone(),
            auth: self.auth.clone(),
            wait: self.wait,
            body_read_timeout: self.body_read_timeout,
            mock_channel: self.mock_channel,
        }
    }
}

/// How requests are authenticated.
#[derive(Clone)]
pub enum Auth {
    /// No keys: everything belongs to tenant `default`, and every caller may do everything (loopback only).
    SingleTenant,
    /// `Authorization: Bearer <key>`: tenant keys and operator keys, kept as SHA-256 digests and compared in
    /// constant time.
    Keys(Arc<Keys>),
}

/// The configured keys, as digests.
pub struct Keys {
    /// `(tenant, digest)`.
    tenants: Vec<(String, [u8; 32])>,
    /// `(operator name, digest)`.
    operators: Vec<(String, [u8; 32])>,
}

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The zero-configuration mode (no keys): tenant `default`, with an operator's rights too.
    Local,
    /// A tenant key: its own tenant's orders, payments and workflows; it may not retry or cancel.
    Tenant(String),
    /// An operator key (named): every tenant's workflows, which it may retry and cancel; no tenant of its own,
    /// so not the tenant routes (orders, tokens, payments).
    Operator(String),
}

impl Caller {
    /// The tenant whose rows the caller's reads are limited to: `None` for one who sees every tenant's.
    pub fn tenant_scope(&self) -> Option<&str> {
        match self {
            Self::Tenant(tenant) => Some(tenant),
            Self::Local | Self::Operator(_) => None,
        }
    }

    /// Whether the caller may steer workflows (retry, cancel).
    pub fn is_operator(&self) -> bool {
        matches!(self, Self::Local | Self::Operator(_))
    }
}

impl Auth {
    /// Tenant keys from `(tenant, key)` pairs.
    pub fn keys(pairs: Vec<(String, String)>) -> Self {
        Self::Keys(Arc::new(Keys { tenants: digests(pairs), operators: Vec::new() }))
    }

    /// These keys, with operator keys from `(name, key)` pairs added.
    pub fn with_operators(self, pairs: Vec<(String, String)>) -> Self {
        let tenants = match &self {
            Self::SingleTenant => Vec::new(),
            Self::Keys(keys) => keys.tenants.clone(),
        };
        Self::Keys(Arc::new(Keys { tenants, operators: digests(pairs) }))
    }

    /// The tenants the configured keys name (`default` without keys): the tenants an operator's search reads.
    pub fn tenants(&self) -> Vec<String> {
        match self {
            Self::SingleTenant => vec![DEFAULT_TENANT.to_owned()],
            Self::Keys(keys) => {
                let mut names: Vec<String> = keys.tenants.iter().map(|(t, _)| t.clone()).collect();
                names.sort();
                names.dedup();
                names
            }
        }
    }

    /// Whether operator keys are configured.
    pub fn has_operators(&self) -> bool {
        matches!(self, Self::Keys(keys) if !keys.operators.is_empty())
    }

    /// Who presents `presented`; `None` for no key or an unknown one (keys configured).
    pub fn caller(&self, presented: Option<&str>) -> Option<Caller> {
        match self {
            Self::SingleTenant => Some(Caller::Local),
            Self::Keys(keys) => {
                let presented = digest(presented?);
                // Every key is compared, in constant time, whatever matches (tenant and operator keys alike: the
                // time taken says nothing of which kind a key is).
                let mut found = None;
                for (tenant, key) in &keys.tenants {
                    if same(key, &presented) {
                        found = Some(Caller::Tenant(tenant.clone()));
                    }
                }
                for (name, key) in &keys.operators {
                    if same(key, &presented) {
                        found = Some(Caller::Operator(name.clone()));
                    }
                }
                found
            }
        }
    }
}

fn digests(pairs: Vec<(String, String)>) -> Vec<(String, [u8; 32])> {
    pairs.into_iter().map(|(name, key)| (name, digest(&key))).collect()
}

/// Whether two digests are equal, in time that does not depend on where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The tenant a request acts for: a tenant key's, or `default` without keys. An operator key is refused
/// (`403 forbidden`): operators are nobody's tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// The bearer key of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

fn unauthorized() -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized", "a valid API key is required")
}

impl<S: PaymentStore> FromRequestParts<AppState<S>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState<S>) -> Result<Self, Self::Rejection> {
        state.auth.caller(bearer(&parts.headers)).ok_or_else(unauthorized)
    }
}

impl<S: PaymentStore> FromRequestParts<AppState<S>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState<S>) -> Result<Self, Self::Rejection> {
        match Caller::from_request_parts(parts, state).await? {
            Caller::Local => Ok(Tenant(DEFAULT_TENANT.to_owned())),
            Caller::Tenant(tenant) => Ok(Tenant(tenant)),
            Caller::Operator(_) => Err(ApiError::forbidden(
                "an operator key inspects and steers workflows; orders, tokens and payments take a tenant's key",
            )),
        }
    }
}

/// `/metrics`: operators only once keys are configured — its counts are every tenant's, so neither anyone nor a
/// tenant key may read them (with `--api-keys` alone, nobody: scrape with an operator key). Without keys (the
/// zero-configuration mode, loopback only) anyone.
pub(crate) fn may_scrape<S: PaymentStore>(state: &AppState<S>, headers: &HeaderMap) -> Result<(), ApiError> {
    match state.auth.caller(bearer(headers)) {
        Some(caller) if caller.is_operator() => Ok(()),
        Some(_) => Err(ApiError::forbidden("metrics are for operator keys")),
        None => Err(unauthorized()),
    }
}
