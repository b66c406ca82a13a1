//! The mock channel: the channel protocol with seeded faults and a ledger tests can read. It answers
//! in-process (as a [`Channel`]) and over HTTP (see `mock_channel_router`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::mock_notify::{self, Pending};
use super::{
    Channel, ChannelError, Charge, ChargeRequest, ChargeStatus, Closed, EntryKind, Refund, RefundRequest, RefundStatus,
    Statement, StatementLine,
};

/// A merchant and one of its numbers: what the channel keeps apart.
type Key = (String, String);

/// The mock channel's faults (rates are 0.0–1.0) and timings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MockChannelConfig {
    /// Delay before every reply.
    pub latency_ms: u64,
    /// Share of new charges declined.
    pub decline_rate: f64,
    /// Share of charge requests answered `500` before anything is charged.
    pub error_before_rate: f64,
    /// Share of charge requests that charge and then answer `500` (the reply is lost).
    pub error_after_rate: f64,
    /// Share of charge requests that charge and reply only after `slow_ms` (past the client's timeout).
    pub slow_rate: f64,
    /// How late a slow reply comes.
    pub slow_ms: u64,
    /// Share of new charges that stay `processing` for `settle_ms`.
    pub processing_rate: f64,
    /// How long a processing charge takes to settle.
    pub settle_ms: u64,
    /// How long a new charge request is held after it arrives before the channel records it (a charge in
    /// flight, which a `close` meanwhile refuses).
    pub hold_ms: u64,
    /// Share of new refunds that end `failed` (nothing refunded).
    pub refund_fail_rate: f64,
    /// Share of new refunds that stay `processing` for `settle_ms` before they settle.
    pub refund_processing_rate: f64,
    /// Share of refund requests answered `500` after the refund was recorded (the reply is lost).
    pub refund_error_after_rate: f64,
    /// Seed of the fault dice, for reproducible runs.
    pub seed: u64,
    /// `(merchant_id, secret)`: the secrets notifications are signed with (`--notify-secret`); a merchant with
    /// several is signed with each (a rotation). A merchant with none gets no notifications.
    pub notify_secrets: Vec<(String, String)>,
    /// The waits between a notification's attempts (`--notify-schedule`); empty: the contract's
    /// ([`super::DEFAULT_NOTIFY_SCHEDULE`]).
    pub notify_schedule: Vec<Duration>,
}

/// What happens to one charge request besides its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Answer `500` without charging.
    ErrorBefore,
    /// Charge, then answer `500`.
    ErrorAfter,
    /// Charge, then answer after `slow_ms`.
    Slow,
}

#[derive(Debug, Clone)]
struct StoredRefund {
    request: RefundRequest,
    refund_id: String,
    /// What the refund becomes once settled.
    outcome: RefundStatus,
    settles_at: Instant,
    /// The same moment on the wall clock: the day of the statement it is in.
    settled_at: chrono::DateTime<chrono::Utc>,
}

impl StoredRefund {
    fn view(&self, now: Instant) -> Refund {
        Refund {
            merchant_id: Some(self.request.merchant_id.clone()),
            merchant_refund_no: self.request.merchant_refund_no.clone(),
            merchant_request_no: self.request.merchant_request_no.clone(),
            refund_id: self.refund_id.clone(),
            amount: self.request.amount,
            status: if now >= self.settles_at { self.outcome } else { RefundStatus::Processing },
        }
    }
}

#[derive(Debug, Clone)]
struct StoredCharge {
    request: ChargeRequest,
    charge_id: String,
    /// What the charge becomes once settled.
    outcome: ChargeStatus,
    decline_code: Option<String>,
    settles_at: Instant,
    /// The same moment on the wall clock: the day of the statement it is in.
    settled_at: chrono::DateTime<chrono::Utc>,
}

/// Everything the channel has done, for tests and the chaos run.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Ledger {
    /// Every charge (one per `merchant_request_no`), in its current status.
    pub charges: Vec<LedgerCharge>,
    /// Every refund.
    pub refunds: Vec<Refund>,
    /// Charge requests received (repeats included).
    pub charge_calls: u64,
    /// Queries received.
    pub query_calls: u64,
    /// Refund requests received.
    pub refund_calls: u64,
    /// Notification attempts sent (resends included).
    pub notifications_sent: u64,
}

/// A charge in the ledger.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LedgerCharge {
    /// The merchant (tenant) charging.
    pub merchant_id: String,
    /// The payment's `request_no`.
    pub merchant_request_no: String,
    /// The order.
    pub order_no: String,
    /// Minor units.
    pub amount: i64,
    /// Current status.
    pub status: ChargeStatus,
    /// Whether a succeeded refund exists for it.
    pub refunded: bool,
    /// What its succeeded refunds add up to (minor units).
    pub refunded_amount: i64,
}

impl Ledger {
    /// Succeeded, unrefunded charges of `order_no`, whichever merchant's.
    pub fn kept_charges(&self, order_no: &str) -> usize {
        self.charges.iter().filter(|c| c.order_no == order_no && c.is_kept()).count()
    }

    /// Succeeded, unrefunded charges of merchant `merchant_id`'s order `order_no`.
    pub fn kept_charges_of(&self, merchant_id: &str, order_no: &str) -> usize {
        self.charges.iter().filter(|c| c.merchant_id == merchant_id && c.order_no == order_no && c.is_kept()).count()
    }
}

impl LedgerCharge {
    /// Succeeded and not refunded in full: money the merchant keeps (all of it, or what partial refunds left).
    pub fn is_kept(&self) -> bool {
        self.status == ChargeStatus::Succeeded && self.refunded_amount < self.amount
    }
}

#[derive(Debug, Default)]
struct State {
    rng: u64,
    charges: HashMap<Key, StoredCharge>,
    /// Numbers closed with no charge: a charge under them is refused from then on.
    closed: HashSet<Key>,
    refunds: HashMap<Key, StoredRefund>,
    next_id: u64,
    charge_calls: u64,
    query_calls: u64,
    refund_calls: u64,
}

/// When something settles `after` `now`, on both clocks. The instant is `now`'s own, not read again: an answer
/// viewed at `now` must see a charge that settles at once as settled.
fn settling(now: Instant, after: Duration) -> (Instant, chrono::DateTime<chrono::Utc>) {
    let wall = chrono::Utc::now() + chrono::Duration::from_std(after).unwrap_or_default();
    (now + after, wall)
}

impl State {
    /// splitmix64: a few lines of seeded dice, enough for fault injection.
    fn roll(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn view(&self, c: &StoredCharge, now: Instant) -> Charge {
        let status = if now >= c.settles_at { c.outcome } else { ChargeStatus::Processing };
        Charge {
            merchant_id: Some(c.request.merchant_id.clone()),
            merchant_request_no: c.request.merchant_request_no.clone(),
            charge_id: c.charge_id.clone(),
            status,
            amount: c.request.amount,
            currency: c.request.currency.clone(),
            order_no: Some(c.request.order_no.clone()),
            decline_code: (status == ChargeStatus::Declined).then(|| c.decline_code.clone()).flatten(),
        }
    }
}

/// The mock channel. Cheap to clone; clones share one ledger.
#[derive(Debug, Clone)]
pub struct MockChannel {
    config: Arc<MockChannelConfig>,
    state: Arc<Mutex<State>>,
    /// Notification attempts sent.
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl MockChannel {
    /// A mock channel with these faults.
    pub fn new(config: MockChannelConfig) -> Self {
        let state = State { rng: config.seed, ..State::default() };
        Self { config: Arc::new(config), state: Arc::new(Mutex::new(state)), sent: Arc::default() }
    }

    /// The same channel (one ledger) answering with other faults from now on.
    pub fn with_config(&self, config: MockChannelConfig) -> Self {
        Self { config: Arc::new(config), state: self.state.clone(), sent: self.sent.clone() }
    }

    /// A mock channel without faults.
    pub fn reliable() -> Self {
        Self::new(MockChannelConfig::default())
    }

    /// Its configuration.
    pub fn config(&self) -> &MockChannelConfig {
        &self.config
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of everything the channel did.
    pub fn ledger(&self) -> Ledger {
        let state = self.state();
        let now = Instant::now();
        let mut refunded: HashMap<(&str, &str), i64> = HashMap::new();
        for r in state.refunds.values().filter(|r| r.view(now).status == RefundStatus::Succeeded) {
            *refunded.entry((r.request.merchant_id.as_str(), r.request.merchant_request_no.as_str())).or_default() +=
                r.request.amount;
        }
        let mut charges: Vec<LedgerCharge> = state
            .charges
            .values()
            .map(|c| {
                let key = (c.request.merchant_id.as_str(), c.request.merchant_request_no.as_str());
                let refunded_amount = refunded.get(&key).copied().unwrap_or(0);
                LedgerCharge {
                    merchant_id: c.request.merchant_id.clone(),
                    merchant_request_no: c.request.merchant_request_no.clone(),
                    order_no: c.request.order_no.clone(),
                    amount: c.request.amount,
                    status: state.view(c, now).status,
                    refunded: refunded_amount > 0,
                    refunded_amount,
                }
            })
            .collect();
        charges.sort_by(|a, b| (&a.merchant_id, &a.merchant_request_no).cmp(&(&b.merchant_id, &b.merchant_request_no)));
        let mut refunds: Vec<Refund> = state.refunds.values().map(|r| r.view(now)).collect();
        refunds.sort_by(|a, b| a.merchant_refund_no.cmp(&b.merchant_refund_no));
        Ledger {
            charges,
            refunds,
            charge_calls: state.charge_calls,
            query_calls: state.query_calls,
            refund_calls: state.refund_calls,
            notifications_sent: self.sent.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    async fn latency(&self) {
        if self.config.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.config.latency_ms)).await;
        }
    }

    /// Handles a charge request: the answer (`Err` is a refusal: status and message) and the fault, if any.
    pub(crate) async fn handle_charge(
        &self,
        request: &ChargeRequest,
    ) -> (Result<Charge, (u16, String)>, Option<Fault>) {
        self.latency().await;
        if self.config.hold_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.config.hold_ms)).await;
        }
        let (answer, fault, pending) = self.record_charge(request);
        if let Some(pending) = pending {
            self.notify(pending);
        }
        (answer, fault)
    }

    /// The secrets of `merchant_id`'s notifications.
    fn secrets(&self, merchant_id: &str) -> Vec<String> {
        self.config.notify_secrets.iter().filter(|(m, _)| m == merchant_id).map(|(_, s)| s.clone()).collect()
    }

    /// Sends `pending` in the background, on the configured schedule, if its merchant has a secret.
    fn notify(&self, pending: Pending) {
        let secrets = self.secrets(&pending.merchant_id);
        if secrets.is_empty() {
            tracing::debug!(merchant_id = %pending.merchant_id, "no --notify-secret for this merchant: not notified");
            return;
        }
        let schedule = if self.config.notify_schedule.is_empty() {
            super::DEFAULT_NOTIFY_SCHEDULE.to_vec()
        } else {
            self.config.notify_schedule.clone()
        };
        tokio::spawn(mock_notify::deliver(pending, secrets, schedule, self.sent.clone()));
    }

    /// The charge request's answer, its fault, and the notification it owes once settled (a new charge
    /// with a `notify_url`).
    #[allow(clippy::type_complexity)]
    fn record_charge(
        &self,
        request: &ChargeRequest,
    ) -> (Result<Charge, (u16, String)>, Option<Fault>, Option<Pending>) {
        let mut state = self.state();
        state.charge_calls += 1;
        let fault = {
            let cfg = &self.config;
            let dice = state.roll();
            let mut edge = cfg.error_before_rate;
            if dice < edge {
                return (Err((500, "injected error before charging".into())), Some(Fault::ErrorBefore), None);
            }
            edge += cfg.error_after_rate;
            if dice < edge {
                Some(Fault::ErrorAfter)
            } else if dice < edge + cfg.slow_rate {
                Some(Fault::Slow)
            } else {
                None
            }
        };
        if request.amount <= 0
            || request.merchant_id.is_empty()
            || request.merchant_request_no.is_empty()
            || request.currency.len() != 3
        {
            return (Err((422, "invalid charge request".into())), None, None);
        }
        let now = Instant::now();
        let key = (request.merchant_id.clone(), request.merchant_request_no.clone());
        if let Some(existing) = state.charges.get(&key) {
            if !existing.request.same_charge(request) {
                return (Err((409, "merchant_request_no reused with other fields".into())), None, None);
            }
            let view = state.view(existing, now);
            return (Ok(view), fault, None);
        }
        if state.closed.contains(&key) {
            return (Err((409, "closed".into())), None, None);
        }
        let declined = state.roll() < self.config.decline_rate;
        let processing = state.roll() < self.config.processing_rate;
        state.next_id += 1;
        let (settles_at, settled_at) =
            settling(now, if processing { Duration::from_millis(self.config.settle_ms) } else { Duration::ZERO });
        let stored = StoredCharge {
            request: request.clone(),
            charge_id: format!("ch_{:08}", state.next_id),
            outcome: if declined { ChargeStatus::Declined } else { ChargeStatus::Succeeded },
            decline_code: declined.then(|| "insufficient_funds".to_owned()),
            settles_at,
            settled_at,
        };
        let view = state.view(&stored, now);
        let pending = request.notify_url.clone().map(|url| {
            let settled = state.view(&stored, settles_at);
            let kind = if declined { "charge.declined" } else { "charge.succeeded" };
            Pending::new(url, &stored.charge_id, kind, &request.merchant_id, settles_at, &settled)
        });
        state.charges.insert(key, stored);
        (Ok(view), fault, pending)
    }

    pub(crate) async fn handle_query(&self, merchant_id: &str, merchant_request_no: &str) -> Option<Charge> {
        self.latency().await;
        let mut state = self.state();
        state.query_calls += 1;
        let now = Instant::now();
        let key = (merchant_id.to_owned(), merchant_request_no.to_owned());
        state.charges.get(&key).map(|c| state.view(c, now))
    }

    /// Closes a number: [`Closed::Closed`] if no charge was accepted under it (none will be from now on),
    /// otherwise the charge.
    pub(crate) async fn handle_close(&self, merchant_id: &str, merchant_request_no: &str) -> Closed {
        self.latency().await;
        let mut state = self.state();
        let now = Instant::now();
        let key = (merchant_id.to_owned(), merchant_request_no.to_owned());
        if let Some(charge) = state.charges.get(&key) {
            return Closed::Charged(state.view(charge, now));
        }
        state.closed.insert(key);
        Closed::Closed
    }

    /// Handles a refund request: the refund (`Err` is a refusal: status and message), and whether its reply is
    /// lost (answered `500` although the refund was recorded). A charge may be refunded in parts, as long as its
    /// refunds that succeeded or are processing add up to no more than it.
    pub(crate) async fn handle_refund(&self, request: &RefundRequest) -> (Result<Refund, (u16, String)>, bool) {
        self.latency().await;
        let (answer, lost, pending) = self.record_refund(request);
        if let Some(pending) = pending {
            self.notify(pending);
        }
        (answer, lost)
    }

    /// The refund request's answer, whether its reply is lost, and the notification it owes once settled.
    #[allow(clippy::type_complexity)]
    fn record_refund(&self, request: &RefundRequest) -> (Result<Refund, (u16, String)>, bool, Option<Pending>) {
        let mut state = self.state();
        state.refund_calls += 1;
        let lost = state.roll() < self.config.refund_error_after_rate;
        let now = Instant::now();
        let refund_key = (request.merchant_id.clone(), request.merchant_refund_no.clone());
        if let Some(existing) = state.refunds.get(&refund_key) {
            if !existing.request.same_refund(request) {
                return (Err((409, "conflict".into())), false, None);
            }
            return (Ok(existing.view(now)), lost, None);
        }
        let charge_key = (request.merchant_id.clone(), request.merchant_request_no.clone());
        let Some(charge) = state.charges.get(&charge_key).map(|c| state.view(c, now)) else {
            return (Err((409, "not_refundable".into())), false, None);
        };
        if charge.status != ChargeStatus::Succeeded || request.amount <= 0 {
            return (Err((409, "not_refundable".into())), false, None);
        }
        let taken: i64 = state
            .refunds
            .values()
            .filter(|r| r.request.merchant_id == request.merchant_id)
            .filter(|r| r.request.merchant_request_no == request.merchant_request_no)
            .filter(|r| r.view(now).status != RefundStatus::Failed)
            .map(|r| r.request.amount)
            .sum();
        if taken + request.amount > charge.amount {
            return (Err((409, "exceeds_charge".into())), false, None);
        }
        let failed = state.roll() < self.config.refund_fail_rate;
        let processing = state.roll() < self.config.refund_processing_rate;
        state.next_id += 1;
        let (settles_at, settled_at) =
            settling(now, if processing { Duration::from_millis(self.config.settle_ms) } else { Duration::ZERO });
        let stored = StoredRefund {
            request: request.clone(),
            refund_id: format!("re_{:08}", state.next_id),
            outcome: if failed { RefundStatus::Failed } else { RefundStatus::Succeeded },
            settles_at,
            settled_at,
        };
        let view = stored.view(now);
        let pending = request.notify_url.clone().map(|url| {
            let kind = if failed { "refund.failed" } else { "refund.succeeded" };
            Pending::new(url, &stored.refund_id, kind, &request.merchant_id, settles_at, &stored.view(settles_at))
        });
        state.refunds.insert(refund_key, stored);
        (Ok(view), lost, pending)
    }

    /// The merchant's statement of the UTC `day`: every charge and refund settled during it, `None` for a day
    /// after today. Days before today are complete; today grows.
    pub(crate) fn statement_of(&self, merchant_id: &str, day: chrono::NaiveDate) -> Option<Statement> {
        let today = chrono::Utc::now().date_naive();
        if day > today {
            return None;
        }
        let state = self.state();
        let now = Instant::now();
        let settled = |at: Instant, wall: &chrono::DateTime<chrono::Utc>| now >= at && wall.date_naive() == day;
        let stamp = |wall: &chrono::DateTime<chrono::Utc>| wall.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut lines: Vec<StatementLine> = state
            .charges
            .values()
            .filter(|c| c.request.merchant_id == merchant_id && settled(c.settles_at, &c.settled_at))
            .map(|c| StatementLine {
                kind: EntryKind::Charge,
                merchant_request_no: c.request.merchant_request_no.clone(),
                merchant_refund_no: None,
                charge_id: Some(c.charge_id.clone()),
                refund_id: None,
                order_no: Some(c.request.order_no.clone()),
                amount: c.request.amount,
                currency: Some(c.request.currency.clone()),
                status: if c.outcome == ChargeStatus::Declined { "declined" } else { "succeeded" }.to_owned(),
                settled_at: stamp(&c.settled_at),
            })
            .collect();
        lines.extend(
            state
                .refunds
                .values()
                .filter(|r| r.request.merchant_id == merchant_id && settled(r.settles_at, &r.settled_at))
                .map(|r| StatementLine {
                    kind: EntryKind::Refund,
                    merchant_request_no: r.request.merchant_request_no.clone(),
                    merchant_refund_no: Some(r.request.merchant_refund_no.clone()),
                    charge_id: None,
                    refund_id: Some(r.refund_id.clone()),
                    order_no: None,
                    amount: r.request.amount,
                    currency: None,
                    status: if r.outcome == RefundStatus::Failed { "failed" } else { "succeeded" }.to_owned(),
                    settled_at: stamp(&r.settled_at),
                }),
        );
        Some(Statement::of_lines(day < today, lines))
    }

    pub(crate) async fn handle_refund_query(&self, merchant_id: &str, merchant_refund_no: &str) -> Option<Refund> {
        self.latency().await;
        let key = (merchant_id.to_owned(), merchant_refund_no.to_owned());
        self.state().refunds.get(&key).map(|r| r.view(Instant::now()))
    }
}

/// In-process calls: a fault becomes what the HTTP client would have seen (an unknown outcome), without
/// waiting for a slow reply.
#[async_trait::async_trait]
impl Channel for MockChannel {
    async fn charge(&self, request: &ChargeRequest) -> Result<Charge, ChannelError> {
        match self.handle_charge(request).await {
            (_, Some(Fault::ErrorBefore | Fault::ErrorAfter)) => {
                Err(ChannelError::Unknown("channel answered 500".into()))
            }
            (_, Some(Fault::Slow)) => Err(ChannelError::Unknown("timed out".into())),
            (Ok(charge), None) => Ok(charge),
            (Err((status, body)), None) => Err(ChannelError::Refused { status, body }),
        }
    }

    async fn query(&self, merchant_id: &str, merchant_request_no: &str) -> Result<Option<Charge>, ChannelError> {
        Ok(self.handle_query(merchant_id, merchant_request_no).await)
    }

    async fn close(&self, merchant_id: &str, merchant_request_no: &str) -> Result<Closed, ChannelError> {
        Ok(self.handle_close(merchant_id, merchant_request_no).await)
    }

    async fn refund(&self, request: &RefundRequest) -> Result<Refund, ChannelError> {
        match self.handle_refund(request).await {
            (_, true) => Err(ChannelError::Unknown("channel answered 500".into())),
            (answer, false) => answer.map_err(|(status, body)| ChannelError::Refused { status, body }),
        }
    }

    async fn query_refund(&self, merchant_id: &str, merchant_refund_no: &str) -> Result<Option<Refund>, ChannelError> {
        Ok(self.handle_refund_query(merchant_id, merchant_refund_no).await)
    }

    async fn statement(&self, merchant_id: &str, day: chrono::NaiveDate) -> Result<Option<Statement>, ChannelError> {
        Ok(self.statement_of(merchant_id, day))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_charge_that_settles_at_once_is_answered_settled() {
        let mock = MockChannel::reliable();
        let request = ChargeRequest {
            merchant_id: "m".into(),
            merchant_request_no: "R-1".into(),
            order_no: "O-1".into(),
            amount: 100,
            currency: "CNY".into(),
            notify_url: None,
        };
        for _ in 0..100 {
            let request = ChargeRequest { merchant_request_no: uuid::Uuid::new_v4().to_string(), ..request.clone() };
            assert_eq!(mock.charge(&request).await.unwrap().status, ChargeStatus::Succeeded);
        }
        let repeat = ChargeRequest { notify_url: Some("http://x".into()), ..request.clone() };
        mock.charge(&request).await.unwrap();
        assert_eq!(mock.charge(&repeat).await.unwrap().status, ChargeStatus::Succeeded, "notify_url is no new field");
    }
}
