//! The operator console (contracts/console.md) at `/console`: plain HTML, CSS and JavaScript modules, built
//! into the binary (no build step, nothing fetched at run time), served with a strict Content-Security-Policy.
//! It is a client of the API like any other: it can do nothing the API does not allow its key to do.
//!
//! Safe by construction: the scripts render everything as text (no `innerHTML`), the policy forbids inline
//! scripts and styles and every other origin, and the API sends no CORS headers, so no other site's page can
//! call it with a key.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use onceflow_payments::PaymentStore;

use crate::error::ApiError;
use crate::state::AppState;

/// What a console page may load and do: its own scripts, styles and API, nothing inline, no frames, no plugins;
/// and no markup written from strings at all (Trusted Types required, no policy may be made), so that a sink
/// like `innerHTML` throws rather than renders, whatever a future script does.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'";

/// The console's files, by their path under `/console/`.
const FILES: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("../console/index.html")),
    ("console.css", "text/css; charset=utf-8", include_str!("../console/console.css")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../console/app.js")),
    ("api.js", "text/javascript; charset=utf-8", include_str!("../console/api.js")),
    ("dom.js", "text/javascript; charset=utf-8", include_str!("../console/dom.js")),
    ("actions.js", "text/javascript; charset=utf-8", include_str!("../console/actions.js")),
    ("timeline.js", "text/javascript; charset=utf-8", include_str!("../console/timeline.js")),
    ("pages/attention.js", "text/javascript; charset=utf-8", include_str!("../console/pages/attention.js")),
    ("pages/find.js", "text/javascript; charset=utf-8", include_str!("../console/pages/find.js")),
    ("pages/payment.js", "text/javascript; charset=utf-8", include_str!("../console/pages/payment.js")),
    ("pages/workflows.js", "text/javascript; charset=utf-8", include_str!("../console/pages/workflows.js")),
    ("pages/reconciliation.js", "text/javascript; charset=utf-8", include_str!("../console/pages/reconciliation.js")),
];

/// The console's routes, handed up to the application (`app.rs`).
pub(crate) fn routes<S: PaymentStore>() -> Router<AppState<S>> {
    Router::new()
        .route("/console", get(|| async { Redirect::permanent("/console/") }))
        .route("/console/", get(|| async { file("index.html") }))
        .route("/console/{*path}", get(|Path(path): Path<String>| async move { file(&path) }))
}

/// One of the console's files with the headers every console answer carries.
fn file(path: &str) -> Response {
    let Some((_, content_type, body)) = FILES.iter().find(|(name, _, _)| *name == path) else {
        return ApiError::not_found("not_found", "no such console file").into_response();
    };
    let mut response = (StatusCode::OK, *body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // A new binary's files replace the old ones at once: the browser asks again, the answer is small.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    /// No script renders markup from data: every text reaches the page through `textContent` or text nodes.
    #[test]
    fn no_script_writes_markup() {
        for (name, _, body) in super::FILES {
            for banned in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"] {
                assert!(!body.contains(banned), "{name} uses {banned}");
            }
            if name.ends_with(".html") {
                assert!(!body.contains("<script>") && !body.contains(" style="), "{name}: inline script or style");
            }
        }
    }
}
