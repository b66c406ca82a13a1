//! Paths that can name nothing. Every identifier in a path is UTF-8 text without NUL (the id types refuse NUL,
//! and no database stores it in text: Postgres errors on it, so a NUL in a workflow id was a `503` and a logged
//! database error). A path whose percent-escapes decode to a NUL or to bytes that are not UTF-8 is answered
//! `404` with the code of what it would have named — before any route reads it — rather than reaching a
//! database, or the path extractor's `400` in `text/plain`.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Answers `404` to a request whose path decodes to a NUL or to bytes that are not UTF-8, and `400` to one whose
/// query decodes to a NUL (no query parameter is free to hold one: each reaches a database as text).
pub(super) async fn name_something(req: Request, next: Next) -> Response {
    if names_nothing(req.uri().path()) {
        let route = req.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
        return ApiError::not_found(code_of(route), "no such resource").into_response();
    }
    if req.uri().query().is_some_and(|q| decoded(q).contains(&0)) {
        return ApiError::invalid("the query holds a NUL character").into_response();
    }
    next.run(req).await
}

/// Whether `path`, percent-decoded, holds a NUL or is not UTF-8.
fn names_nothing(path: &str) -> bool {
    if !path.contains('%') {
        // Undecoded, the path is what hyper took: visible ASCII, no NUL.
        return false;
    }
    let decoded = decoded(path);
    decoded.contains(&0) || std::str::from_utf8(&decoded).is_err()
}

/// `text` with its percent-escapes decoded (a `%` not followed by two hex digits kept as it is).
fn decoded(text: &str) -> Vec<u8> {
    let raw = text.as_bytes();
    let mut decoded = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let escaped = (raw[i] == b'%')
            .then(|| raw.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                i += 3;
            }
            None => {
                decoded.push(raw[i]);
                i += 1;
            }
        }
    }
    decoded
}

/// The `404` code of a route, by the identifier it takes.
fn code_of(route: Option<&str>) -> &'static str {
    let Some(route) = route else { return "not_found" };
    if route.contains("{workflow_id}") {
        "workflow_not_found"
    } else if route.contains("{refund_no}") {
        "refund_not_found"
    } else if route.contains("{request_no}") {
        "payment_not_found"
    } else if route.contains("{order_no}") {
        "order_not_found"
    } else if route.contains("{event_id}") {
        "event_not_found"
    } else if route.contains("{endpoint_id}") {
        "endpoint_not_found"
    } else {
        "not_found"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_and_bytes_that_are_not_utf8_name_nothing() {
        for nothing in ["/v1/workflows/%00", "/v1/workflows/pay:%00x", "/x/%FF", "/x/%C3%28", "/x/%e2%82", "/a%00/b"] {
            assert!(names_nothing(nothing), "{nothing}");
        }
        for something in ["/v1/workflows/pay:tok_1", "/x/%C3%A9", "/x/%41", "/x/%", "/x/%4", "/x/%zz", "/x/100%25"] {
            assert!(!names_nothing(something), "{something}");
        }
        assert_eq!(code_of(Some("/v1/workflows/{workflow_id}/retry")), "workflow_not_found");
        assert_eq!(code_of(Some("/v1/payments/{request_no}/refunds")), "payment_not_found");
        assert_eq!(code_of(Some("/v1/events/{event_id}/redeliver")), "event_not_found");
        assert_eq!(code_of(Some("/v1/webhook-endpoints/{endpoint_id}/deliveries")), "endpoint_not_found");
        assert_eq!(code_of(None), "not_found");
    }
}
