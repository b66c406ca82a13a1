//! The channel client over HTTP, with a per-request timeout. Numbers in paths are percent-encoded and every
//! request names its merchant (`contracts/channel.md`).
//!
//! An error's text leads with a fixed summary of what happened (`channel unreachable`, `channel timed out`,
//! `channel answered 503`, `channel answer unreadable`) and follows it, after `: `, with the cause for operators
//! (the URL, the socket's error). A step stores the whole text; a tenant's view of the workflow shows the summary
//! alone (`api/src/routes/views.rs`): the channel's address is the operator's business.

use std::time::Duration;

use serde::Deserialize;

use super::{Channel, ChannelError, Charge, ChargeRequest, Closed, Refund, RefundRequest, path_segment};

/// A [`Channel`] speaking `contracts/channel.md` over HTTP.
#[derive(Debug, Clone)]
pub struct HttpChannel {
    base: String,
    client: reqwest::Client,
}

/// The answer of a refused close: `{"error": "charged", "charge": {...}}` (or another error).
#[derive(Deserialize)]
struct CloseRefused {
    error: String,
    charge: Option<Charge>,
}

impl HttpChannel {
    /// A client of the channel at `base` (`http://host:port`), each request bounded by `timeout`.
    pub fn new(base: &str, timeout: Duration) -> Result<Self, ChannelError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| ChannelError::Unknown(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { base: base.trim_end_matches('/').to_owned(), client })
    }

    fn charge_url(&self, merchant_request_no: &str) -> String {
        format!("{}/v1/charges/{}", self.base, path_segment(merchant_request_no))
    }

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<Option<T>, ChannelError> {
        // The trace goes on to the channel: every call names the step that makes it (W3C Trace Context).
        let request = match onceflow_engine::trace::current() {
            Some(traceparent) => request.header("traceparent", traceparent),
            None => request,
        };
        let response = request.send().await.map_err(|e| {
            let summary = if e.is_timeout() { "channel timed out" } else { "channel unreachable" };
            unknown(summary, &e)
        })?;
        let status = response.status().as_u16();
        match status {
            200..=299 => response.json().await.map(Some).map_err(|e| unknown("channel answer unreadable", &e)),
            404 => Ok(None),
            400 | 409 | 422 => {
                let body = response.text().await.unwrap_or_default();
                Err(ChannelError::Refused { status, body })
            }
            _ => Err(ChannelError::Unknown(format!("channel answered {status}"))),
        }
    }
}

/// An unknown outcome: `summary`, then `e` with every source under it (reqwest's own text names only the URL;
/// the refused connection or the timeout is in its sources).
fn unknown(summary: &str, e: &dyn std::error::Error) -> ChannelError {
    let mut text = format!("{summary}: {e}");
    let mut source = e.source();
    while let Some(cause) = source {
        let cause = cause.to_string();
        if !text.ends_with(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = source.and_then(std::error::Error::source);
    }
    ChannelError::Unknown(text)
}

#[async_trait::async_trait]
impl Channel for HttpChannel {
    async fn charge(&self, request: &ChargeRequest) -> Result<Charge, ChannelError> {
        let sent = self.client.post(format!("{}/v1/charges", self.base)).json(request);
        self.send(sent).await?.ok_or_else(|| ChannelError::Unknown("charge answered 404".into()))
    }

    async fn query(&self, merchant_id: &str, merchant_request_no: &str) -> Result<Option<Charge>, ChannelError> {
        let sent = self.client.get(self.charge_url(merchant_request_no)).query(&[("merchant_id", merchant_id)]);
        self.send(sent).await
    }

    async fn close(&self, merchant_id: &str, merchant_request_no: &str) -> Result<Closed, ChannelError> {
        let url = format!("{}/close", self.charge_url(merchant_request_no));
        let sent = self.client.post(url).json(&serde_json::json!({ "merchant_id": merchant_id }));
        match self.send::<serde_json::Value>(sent).await {
            Ok(Some(answer)) if answer["status"] == "closed" => Ok(Closed::Closed),
            Ok(Some(answer)) => Err(ChannelError::Unknown(format!("close answered {answer}"))),
            // A channel without close: nothing to wait for.
            Ok(None) => Err(ChannelError::Refused { status: 404, body: "close is not supported".into() }),
            Err(ChannelError::Refused { status: 409, body }) => match serde_json::from_str::<CloseRefused>(&body) {
                Ok(CloseRefused { error, charge: Some(charge) }) if error == "charged" => Ok(Closed::Charged(charge)),
                _ => Err(ChannelError::Refused { status: 409, body }),
            },
            Err(e) => Err(e),
        }
    }

    async fn refund(&self, request: &RefundRequest) -> Result<Refund, ChannelError> {
        let sent = self.client.post(format!("{}/v1/refunds", self.base)).json(request);
        self.send(sent).await?.ok_or_else(|| ChannelError::Unknown("refund answered 404".into()))
    }

    async fn query_refund(&self, merchant_id: &str, merchant_refund_no: &str) -> Result<Option<Refund>, ChannelError> {
        let url = format!("{}/v1/refunds/{}", self.base, path_segment(merchant_refund_no));
        self.send(self.client.get(url).query(&[("merchant_id", merchant_id)])).await
    }

    async fn statement(
        &self,
        merchant_id: &str,
        day: chrono::NaiveDate,
    ) -> Result<Option<super::Statement>, ChannelError> {
        super::statement::fetch(&self.client, &self.base, merchant_id, day).await
    }
}
