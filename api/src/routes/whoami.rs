//! `GET /v1/whoami`: who the presented key is, so that a client (the console) shows only what that key may do.

use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::state::{Caller, DEFAULT_TENANT};

/// Who a key is.
#[derive(Debug, Serialize, ToSchema)]
pub struct WhoAmI {
    /// `operator` (sees and steers every tenant's workflows), `tenant` (its own, read-only for workflows) or
    /// `local` (no keys configured: tenant `default`, with an operator's rights).
    pub role: String,
    /// The operator key's name, or the tenant's.
    pub name: String,
    /// The tenant whose business the key does; absent for an operator key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Whether it may retry, cancel, query the channel and redeliver any tenant's events.
    pub operator: bool,
}

/// Who the presented key is.
#[utoipa::path(get, path = "/v1/whoami", tag = "operations",
    responses((status = 200, description = "The caller", body = WhoAmI)))]
pub async fn whoami(caller: Caller) -> Json<WhoAmI> {
    let operator = caller.is_operator();
    Json(match caller {
        Caller::Local => {
            WhoAmI { role: "local".into(), name: "local".into(), tenant: Some(DEFAULT_TENANT.into()), operator }
        }
        Caller::Tenant(tenant) => {
            WhoAmI { role: "tenant".into(), name: tenant.clone(), tenant: Some(tenant), operator }
        }
        Caller::Operator(name) => WhoAmI { role: "operator".into(), name, tenant: None, operator },
    })
}
