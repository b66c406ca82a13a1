//! A refund's end outside its confirming phase — a refusal before the channel, a compensation's release or
//! failure, a refund confirmed after all — with its event (the outbox) in the same transaction: the refund as
//! `GET /v1/refunds/{refund_no}` shows it, read back after the write. The confirming phase writes its own
//! (`store/refund_statement.rs`, `store/mysql/refunds.rs`).

use onceflow_engine::{BoxFuture, Conn, StepError};

use crate::model::RefundInput;
use crate::store::{PaymentStore, RefundEnd};

/// [`crate::RefundStore::end_refund`], and when it ended the refund, the refund's event; whether it ended it.
pub(super) fn end_with_event<S: PaymentStore>(
    c: &mut Conn<S>,
    i: RefundInput,
    end: RefundEnd,
    now: i64,
) -> BoxFuture<'_, Result<bool, StepError>> {
    Box::pin(async move {
        let (tenant, refund_no) = (i.tenant.clone(), i.refund_no.clone());
        if !S::end_refund(&mut *c, i, end, now).await? {
            return Ok(false);
        }
        if let Some(event) = S::refund_in(&mut *c, tenant, refund_no).await?.and_then(|r| r.event(now)) {
            S::write_event(&mut *c, &event).await?;
        }
        Ok(true)
    })
}
