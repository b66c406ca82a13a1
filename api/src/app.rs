//! The whole application: the API's routes with what is served beside them. This module is the top of the crate's
//! HTTP side — it names the routes, the OpenAPI document that describes them and the console that calls them —
//! so that none of those needs to name another above it: the routes take their error shapes from `error.rs`
//! below them, and the document and the console hand their own routes up to here.

use axum::Router;
use onceflow_payments::PaymentStore;

use crate::state::AppState;

/// The whole HTTP API over `state`, with its OpenAPI document and the operator console.
pub fn app<S: PaymentStore>(state: AppState<S>) -> Router {
    crate::routes::app(state, crate::openapi::routes().merge(crate::console::routes()))
}

#[cfg(test)]
mod tests {
    /// The routes sit below the document and the console: a route that named either would make an import circle
    /// again (the document names every handler). Their error shapes come from `crate::error`.
    #[test]
    fn routes_do_not_import_the_modules_above_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/routes");
        let mut upward = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for above in ["crate::openapi", "crate::app", "crate::console"] {
                if text.contains(above) {
                    upward.push(format!("{} names {above}", path.display()));
                }
            }
        }
        assert!(upward.is_empty(), "{upward:#?}");
    }
}
