//! Reading a request's body within its time: a client that sends its headers and then trickles or stops its
//! body (a slow POST) would otherwise hold its connection, and with `--max-connections` of them the server.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use super::BODY_LIMIT;
use crate::error::ApiError;

/// Reads the request's body within `timeout` and hands the request on with the body in memory (the routes
/// buffer it anyway). A body that does not arrive in time — or that is still arriving when its connection must
/// make room for another (`server.rs`) — is answered `408 request_timeout` and its connection closed. Reading stops one byte past [`BODY_LIMIT`]: what was read goes on, and the route answers its own
/// `413` (the original design's `/pay` with its `message`).
pub(super) async fn read_within(timeout: Duration, req: Request, next: Next) -> Response {
    let (parts, mut body) = req.into_parts();
    let read = async {
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                buf.extend_from_slice(&data);
                if buf.len() > BODY_LIMIT {
                    break;
                }
            }
        }
        Ok::<_, axum::Error>(buf)
    };
    // Cut short when the connection is closed to make room for another (`server.rs`): answered as if late.
    let phase = parts.extensions.get::<crate::server::Phase>().cloned();
    let closing = async {
        match &phase {
            Some(phase) => phase.closing().await,
            None => std::future::pending().await,
        }
    };
    let read = tokio::select! {
        // A body read in full is answered, even if the connection was picked to close meanwhile.
        biased;
        read = tokio::time::timeout(timeout, read) => read.ok(),
        () = closing => None,
    };
    match read {
        Some(Ok(buf)) => {
            // Read: from here the connection works for its client, and is not the one closed to make room for
            // a new connection (`server.rs`).
            if let Some(phase) = &phase {
                phase.working();
            }
            next.run(Request::from_parts(parts, Body::from(Bytes::from(buf)))).await
        }
        Some(Err(_)) => ApiError::invalid("the request body could not be read").into_response(),
        None => {
            let detail = format!("the request body did not arrive within {}", humantime::format_duration(timeout));
            let mut response = ApiError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", "Request timeout", detail)
                .into_response();
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}
