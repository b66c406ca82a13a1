//! The `Host` a request names, in the zero-configuration mode. Without keys the service trusts whoever reaches
//! it, which only loopback clients can; but a web page can rebind its own name to 127.0.0.1 (DNS rebinding), and
//! a browser then sends it requests — with that name as `Host` — and lets the page read the answers. So without
//! keys only loopback names and addresses are served: `localhost` (and its subdomains, which browsers resolve to
//! loopback themselves), `127.0.0.0/8` and `::1`. With keys, a client proves itself with its key instead.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Answers `421 host_not_allowed` to a request that names another host than a loopback one (in `Host` or in an
/// absolute request target); `400` to an HTTP/1.1 request that names none (HTTP/1.0 is served); and
/// `403 cross_site_request` to one a browser sent for a page of another site (see [`from_another_site`]).
pub(super) async fn loopback_only(req: Request, next: Next) -> Response {
    if req.version() == axum::http::Version::HTTP_11
        && req.uri().authority().is_none()
        && !req.headers().contains_key(header::HOST)
    {
        return ApiError::invalid("an HTTP/1.1 request names its host (Host)").into_response();
    }
    if from_another_site(req.headers()) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_site_request",
            "Cross-site request",
            "without API keys this service answers no request a browser sends for a page of another site",
        )
        .into_response();
    }
    let named =
        req.uri().authority().map(|a| a.as_str().to_owned()).into_iter().chain(
            req.headers().get_all(header::HOST).iter().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        );
    for host in named {
        if !is_loopback(&host) {
            return ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "host_not_allowed",
                "Host not allowed",
                "without API keys this service answers only requests to a loopback name (localhost, 127.0.0.1, [::1])",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Whether a browser sent the request for a page of another site: it says so (`Sec-Fetch-Site: cross-site`), or
/// names an `Origin` that is not a loopback one (`null` included: a sandboxed or local page). A page can send a
/// form's POST anywhere without asking first; it cannot make its browser leave these headers out or lie in them.
/// Clients that are not browsers (curl, the CLI) send neither.
fn from_another_site(headers: &axum::http::HeaderMap) -> bool {
    let cross = headers.get("sec-fetch-site").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
    let foreign_origin = headers.get_all(header::ORIGIN).iter().any(|origin| {
        let origin = String::from_utf8_lossy(origin.as_bytes());
        let authority = origin.split_once("://").map(|(_, rest)| rest.trim_end_matches('/'));
        !authority.is_some_and(is_loopback)
    });
    cross || foreign_origin
}

/// Whether `authority` (`host[:port]`) names a loopback host.
fn is_loopback(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        // `[v6]` or `[v6]:port`.
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || port.strip_prefix(':').is_some_and(is_port) => v6,
            _ => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) if is_port(port) => host,
            Some(_) => return false,
            None => authority,
        },
    };
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The digits of a port (none: the empty port URIs allow).
fn is_port(digits: &str) -> bool {
    digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn loopback_names_and_addresses_only() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "api.localhost:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8080",
            "127.0.0.1:",
        ] {
            assert!(is_loopback(ok), "{ok}");
        }
        for bad in [
            "",
            "example.com",
            "example.com:8080",
            "localhost.example.com",
            "127.0.0.1.nip.io",
            "10.0.0.1",
            "[::2]:80",
            "[::1",
            "[::1]x",
            "0.0.0.0",
            "localhost:80x",
            "localhost:123456",
            "::1",
            "127.0.0.1:8080:1",
        ] {
            assert!(!is_loopback(bad), "{bad}");
        }
    }
}
