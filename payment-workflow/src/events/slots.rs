//! How many attempts one process sends at once, and to whom: no endpoint, and no tenant, can take what the
//! others need.
//!
//! - Every endpoint with a delivery due gets one attempt in flight of its own (its *lane*), whatever the others
//!   do: a dead endpoint holds its own lane, never another's. Lanes are bounded only by the process's total
//!   ([`IN_FLIGHT`]), which due endpoints share in turn.
//! - An endpoint's further attempts (up to [`EventSettings::per_endpoint`] in all) come from shared slots: at
//!   most [`TENANT_SHARED`] per tenant and [`SHARED`] in the process, handed out one at a time in turn, so one
//!   tenant's backlog or slow endpoints leave the rest to the others.
//! - An endpoint gets shared slots only once it has answered `2xx` in this process, and loses them at the
//!   first attempt that fails (an error status, a timeout, no connection): an endpoint that is new or failing
//!   has its lane only (isolated), until it delivers again.
//! - Each pass visits the due endpoints from a random place in their list, so none is always last.
//!
//! A [`Permit`] is one attempt in flight; dropping it (the attempt ended, or its task was aborted) gives its slot
//! back and wakes the loop, which claims again at once rather than at its next poll.
//!
//! [`EventSettings::per_endpoint`]: super::EventSettings::per_endpoint

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Attempts in flight at once in one process, lanes and shared slots together.
pub(crate) const IN_FLIGHT: usize = 512;

/// Attempts beyond each endpoint's first, in one process.
pub(crate) const SHARED: usize = 256;

/// Attempts beyond each endpoint's first, per tenant, in one process.
pub(crate) const TENANT_SHARED: usize = 32;

/// How long an endpoint's last outcome is remembered after its last attempt.
const REMEMBERED: Duration = Duration::from_secs(3600);

/// The attempts in flight in this process, per endpoint and tenant. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Slots {
    inner: Arc<Mutex<Inner>>,
    wake: Arc<Notify>,
    per_endpoint: usize,
}

#[derive(Default)]
struct Inner {
    /// Attempts in flight per endpoint.
    endpoints: HashMap<String, usize>,
    /// Shared slots held per tenant.
    tenants: HashMap<String, usize>,
    /// Shared slots held in all.
    shared: usize,
    /// Attempts in flight in all.
    total: usize,
    /// Whether each endpoint's last attempt here was delivered, and when it ended.
    healthy: HashMap<String, (bool, Instant)>,
}

impl Inner {
    fn in_flight(&self, endpoint: &str) -> usize {
        self.endpoints.get(endpoint).copied().unwrap_or(0)
    }

    /// The attempts `endpoint` may have in flight: all of its share once it delivers, else its lane only.
    fn cap(&self, endpoint: &str, per_endpoint: usize) -> usize {
        match self.healthy.get(endpoint) {
            Some((true, _)) => per_endpoint.max(1),
            _ => 1,
        }
    }

    fn take(&mut self, endpoint: &str, tenant: &str) {
        let n = self.endpoints.entry(endpoint.to_owned()).or_default();
        *n += 1;
        if *n > 1 {
            *self.tenants.entry(tenant.to_owned()).or_default() += 1;
            self.shared += 1;
        }
        self.total += 1;
    }

    fn give_back(&mut self, endpoint: &str, tenant: &str) {
        let Some(n) = self.endpoints.get_mut(endpoint) else { return };
        *n -= 1;
        if *n == 0 {
            self.endpoints.remove(endpoint);
        } else {
            self.shared = self.shared.saturating_sub(1);
            if let Some(t) = self.tenants.get_mut(tenant) {
                *t -= 1;
                if *t == 0 {
                    self.tenants.remove(tenant);
                }
            }
        }
        self.total = self.total.saturating_sub(1);
    }
}

/// One attempt in flight: its slot until dropped.
pub(crate) struct Permit {
    slots: Slots,
    endpoint: String,
    tenant: String,
    /// Wake the loop when dropped (an attempt ended); a slot a claim did not use just goes back.
    wake: bool,
}

impl Permit {
    /// This permit, for an attempt: its end wakes the loop.
    pub(crate) fn used(mut self) -> Self {
        self.wake = true;
        self
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.slots.lock().give_back(&self.endpoint, &self.tenant);
        if self.wake {
            self.slots.wake.notify_one();
        }
    }
}

impl Slots {
    /// Slots for attempts of at most `per_endpoint` at once to one endpoint.
    pub(crate) fn new(per_endpoint: usize) -> Self {
        Self { inner: Arc::default(), wake: Arc::new(Notify::new()), per_endpoint }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding it leaves counts, not broken invariants worth stopping deliveries for.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Resolves once an attempt has ended since the last call (or at once if one did before).
    pub(crate) async fn ended(&self) {
        self.wake.notified().await;
    }

    /// Takes the slots of this pass for `due` (endpoint, tenant), visited from `start` round: lanes first, then
    /// shared slots one at a time in turn. The permits per endpoint, in the order visited.
    pub(crate) fn reserve(&self, due: &[(String, String)], start: usize) -> Vec<(String, Vec<Permit>)> {
        let n = due.len();
        if n == 0 {
            return Vec::new();
        }
        let order: Vec<&(String, String)> = (0..n).map(|i| &due[(start + i) % n]).collect();
        let mut granted: Vec<Vec<Permit>> = (0..n).map(|_| Vec::new()).collect();
        let mut inner = self.lock();
        let permit = |endpoint: &str, tenant: &str| Permit {
            slots: self.clone(),
            endpoint: endpoint.to_owned(),
            tenant: tenant.to_owned(),
            wake: false,
        };
        for (i, (endpoint, tenant)) in order.iter().enumerate() {
            if inner.total >= IN_FLIGHT {
                break;
            }
            if inner.in_flight(endpoint) == 0 {
                inner.take(endpoint, tenant);
                granted[i].push(permit(endpoint, tenant));
            }
        }
        loop {
            let mut more = false;
            for (i, (endpoint, tenant)) in order.iter().enumerate() {
                let held = inner.tenants.get(tenant.as_str()).copied().unwrap_or(0);
                let n = inner.in_flight(endpoint);
                if n == 0
                    || n >= inner.cap(endpoint, self.per_endpoint)
                    || held >= TENANT_SHARED
                    || inner.shared >= SHARED
                    || inner.total >= IN_FLIGHT
                {
                    continue;
                }
                inner.take(endpoint, tenant);
                granted[i].push(permit(endpoint, tenant));
                more = true;
            }
            if !more {
                break;
            }
        }
        drop(inner);
        order.into_iter().zip(granted).filter(|(_, p)| !p.is_empty()).map(|((e, _), p)| (e.clone(), p)).collect()
    }

    /// Records how an attempt to `endpoint` ended: delivered gives it its shared slots, anything else takes them
    /// away (its lane stays).
    pub(crate) fn record(&self, endpoint: &str, delivered: bool) {
        self.lock().healthy.insert(endpoint.to_owned(), (delivered, Instant::now()));
    }

    /// Forgets endpoints not attempted for a while (deleted ones among them).
    pub(crate) fn forget_old(&self) {
        self.lock().healthy.retain(|_, (_, at)| at.elapsed() < REMEMBERED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(endpoints: &[(&str, &str)]) -> Vec<(String, String)> {
        endpoints.iter().map(|(e, t)| ((*e).to_owned(), (*t).to_owned())).collect()
    }

    fn count(reserved: &[(String, Vec<Permit>)], endpoint: &str) -> usize {
        reserved.iter().find(|(e, _)| e == endpoint).map_or(0, |(_, p)| p.len())
    }

    #[test]
    fn every_due_endpoint_gets_its_lane_whatever_the_others_hold() {
        let slots = Slots::new(4);
        let many: Vec<(String, String)> = (0..100).map(|i| (format!("dead-{i}"), "bad".to_owned())).collect();
        for i in 0..100 {
            slots.record(&format!("dead-{i}"), true);
        }
        // A tenant's hundred endpoints, each delivering before: lanes, then 32 shared slots, no more.
        let held = slots.reserve(&many, 0);
        assert_eq!(held.iter().map(|(_, p)| p.len()).sum::<usize>(), 100 + TENANT_SHARED);
        // Another tenant's endpoint and one more of the same tenant still get a lane each.
        let next = slots.reserve(&due(&[("healthy", "good"), ("own", "bad")]), 0);
        assert_eq!((count(&next, "healthy"), count(&next, "own")), (1, 1));
        drop(held);
        drop(next);
        assert_eq!(slots.lock().total, 0, "every slot given back");
        assert_eq!(slots.lock().shared, 0);
    }

    #[test]
    fn an_endpoint_new_or_failing_has_its_lane_only() {
        let slots = Slots::new(4);
        let one = due(&[("e", "t")]);
        let first = slots.reserve(&one, 0);
        assert_eq!(count(&first, "e"), 1, "new: its lane only");
        drop(first);
        slots.record("e", true);
        let healthy = slots.reserve(&one, 0);
        assert_eq!(count(&healthy, "e"), 4);
        drop(healthy);
        slots.record("e", false);
        assert_eq!(count(&slots.reserve(&one, 0), "e"), 1, "failing: isolated");
    }

    #[test]
    fn shared_slots_go_round_in_turn() {
        let slots = Slots::new(4);
        for e in ["a", "b"] {
            slots.record(e, true);
        }
        let both = slots.reserve(&due(&[("a", "t"), ("b", "t")]), 1);
        assert_eq!((count(&both, "a"), count(&both, "b")), (4, 4));
        assert_eq!(both[0].0, "b", "visited from the start given");
    }
}
