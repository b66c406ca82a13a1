//! A channel whose charges and refunds carry `notify_url` (`--public-url`): the saga's requests are left as
//! they are, and the URL is added on the way out, so a payment's request is the same whatever the deployment
//! (a channel compares a repeat on its amount, order and currency, not on where to notify).

use std::sync::Arc;

use super::{Channel, ChannelError, Charge, ChargeRequest, Closed, Refund, RefundRequest, Statement};

/// `inner`, with every charge and refund request carrying `notify_url`.
pub fn with_notify_url(inner: Arc<dyn Channel>, notify_url: String) -> Arc<dyn Channel> {
    Arc::new(Notifying { inner, notify_url })
}

struct Notifying {
    inner: Arc<dyn Channel>,
    notify_url: String,
}

#[async_trait::async_trait]
impl Channel for Notifying {
    async fn charge(&self, request: &ChargeRequest) -> Result<Charge, ChannelError> {
        let request = ChargeRequest { notify_url: Some(self.notify_url.clone()), ..request.clone() };
        self.inner.charge(&request).await
    }

    async fn query(&self, merchant_id: &str, merchant_request_no: &str) -> Result<Option<Charge>, ChannelError> {
        self.inner.query(merchant_id, merchant_request_no).await
    }

    async fn close(&self, merchant_id: &str, merchant_request_no: &str) -> Result<Closed, ChannelError> {
        self.inner.close(merchant_id, merchant_request_no).await
    }

    async fn refund(&self, request: &RefundRequest) -> Result<Refund, ChannelError> {
        let request = RefundRequest { notify_url: Some(self.notify_url.clone()), ..request.clone() };
        self.inner.refund(&request).await
    }

    async fn query_refund(&self, merchant_id: &str, merchant_refund_no: &str) -> Result<Option<Refund>, ChannelError> {
        self.inner.query_refund(merchant_id, merchant_refund_no).await
    }

    async fn statement(&self, merchant_id: &str, day: chrono::NaiveDate) -> Result<Option<Statement>, ChannelError> {
        self.inner.statement(merchant_id, day).await
    }
}
