//! The channel client over HTTP, with a per-request timeout.

use std::time::Duration;

use super::{Channel, ChannelError, Charge, ChargeRequest, Refund, RefundRequest};

/// A [`Channel`] speaking `contracts/channel.md` over HTTP.
#[derive(Debug, Clone)]
pub struct HttpChannel {
    base: String,
    client: reqwest::Client,
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

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<Option<T>, ChannelError> {
        let response = request.send().await.map_err(|e| ChannelError::Unknown(e.to_string()))?;
        let status = response.status().as_u16();
        match status {
            200..=299 => response.json().await.map(Some).map_err(|e| ChannelError::Unknown(e.to_string())),
            404 => Ok(None),
            400 | 409 | 422 => {
                let body = response.text().await.unwrap_or_default();
                Err(ChannelError::Refused { status, body })
            }
            _ => Err(ChannelError::Unknown(format!("channel answered {status}"))),
        }
    }
}

#[async_trait::async_trait]
impl Channel for HttpChannel {
    async fn charge(&self, request: &ChargeRequest) -> Result<Charge, ChannelError> {
        let sent = self.client.post(format!("{}/v1/charges", self.base)).json(request);
        self.send(sent).await?.ok_or_else(|| ChannelError::Unknown("charge answered 404".into()))
    }

    async fn query(&self, merchant_request_no: &str) -> Result<Option<Charge>, ChannelError> {
        self.send(self.client.get(format!("{}/v1/charges/{merchant_request_no}", self.base))).await
    }

    async fn refund(&self, request: &RefundRequest) -> Result<Refund, ChannelError> {
        let sent = self.client.post(format!("{}/v1/refunds", self.base)).json(request);
        self.send(sent).await?.ok_or_else(|| ChannelError::Unknown("refund answered 404".into()))
    }
}
