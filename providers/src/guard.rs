//! Per-provider admission: a circuit breaker and a concurrency cap.
//!
//! Invariants:
//! - the breaker opens on a throttling answer, a server error, a timeout or a failed
//!   connection (the SDK's own retries have already run by then), and stays open for the
//!   configured time; after it, exactly one request is let through as a probe, whose success
//!   closes the breaker and whose failure opens it again;
//! - a caller error (a validation error) says nothing about the provider's health and leaves
//!   the breaker as it is;
//! - at most `max_concurrency` requests hold a [`Pass`] at once; a pass is returned when it is
//!   dropped, so a request that ends any way (finished, failed, cancelled) frees its slot;
//! - [`Guard::available`] is what planning sees: it is false exactly when [`Guard::enter`]
//!   would refuse now.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests flow.
    Closed,
    /// Requests are refused until the instant; then one probe may go.
    Open {
        /// When a probe may go.
        until: Instant,
    },
    /// A probe is in flight; everything else is refused.
    Probing,
}

/// Why [`Guard::enter`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The breaker is open (or a probe is in flight).
    BreakerOpen,
    /// The concurrency cap is reached.
    AtCapacity,
}

/// How a request ended, as far as the provider's health goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The provider answered.
    Healthy,
    /// Throttling, a server error, a timeout or no connection.
    Unhealthy,
    /// The caller's fault; no evidence either way.
    Neutral,
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    /// Times the breaker opened (for status and metrics).
    opened: u64,
}

/// One provider's breaker and cap.
#[derive(Debug)]
pub struct Guard {
    inner: Mutex<Inner>,
    in_flight: Arc<AtomicU32>,
    max_concurrency: u32,
    open_for: Duration,
}

/// Admission of one request; dropping it frees the concurrency slot.
#[derive(Debug)]
pub struct Pass {
    in_flight: Arc<AtomicU32>,
    /// Whether this request is the breaker's probe.
    pub probe: bool,
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Guard {
    /// A closed breaker with `max_concurrency` slots that opens for `open_for`.
    pub fn new(max_concurrency: u32, open_for: Duration) -> Guard {
        Guard {
            inner: Mutex::new(Inner { state: BreakerState::Closed, opened: 0 }),
            in_flight: Arc::new(AtomicU32::new(0)),
            max_concurrency: max_concurrency.max(1),
            open_for,
        }
    }

    /// Whether a request would be admitted at `now`.
    pub fn available(&self, now: Instant) -> bool {
        let breaker_lets = match self.inner.lock().map(|i| i.state) {
            Ok(BreakerState::Closed) => true,
            Ok(BreakerState::Open { until }) => now >= until,
            Ok(BreakerState::Probing) | Err(_) => false,
        };
        breaker_lets && self.in_flight.load(Ordering::Acquire) < self.max_concurrency
    }

    /// Admits one request at `now`, or says why not.
    pub fn enter(&self, now: Instant) -> Result<Pass, Refusal> {
        let Ok(mut inner) = self.inner.lock() else { return Err(Refusal::BreakerOpen) };
        let probe = match inner.state {
            BreakerState::Closed => false,
            BreakerState::Open { until } if now >= until => true,
            BreakerState::Open { .. } | BreakerState::Probing => return Err(Refusal::BreakerOpen),
        };
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max_concurrency).then_some(n + 1));
        if taken.is_err() {
            return Err(Refusal::AtCapacity);
        }
        if probe {
            inner.state = BreakerState::Probing;
        }
        Ok(Pass { in_flight: self.in_flight.clone(), probe })
    }

    /// Records how an admitted request went.
    pub fn record(&self, pass: &Pass, verdict: Verdict, now: Instant) {
        let Ok(mut inner) = self.inner.lock() else { return };
        match verdict {
            Verdict::Unhealthy => {
                if !matches!(inner.state, BreakerState::Open { .. }) {
                    inner.opened += 1;
                }
                inner.state = BreakerState::Open { until: now + self.open_for };
            }
            Verdict::Healthy if pass.probe => inner.state = BreakerState::Closed,
            // A probe that ended for the caller's reasons proves nothing: let the next one try.
            Verdict::Neutral if pass.probe => inner.state = BreakerState::Open { until: now },
            Verdict::Healthy | Verdict::Neutral => {}
        }
    }

    /// The breaker's state now.
    pub fn state(&self) -> BreakerState {
        self.inner.lock().map(|i| i.state).unwrap_or(BreakerState::Probing)
    }

    /// Times the breaker has opened.
    pub fn times_opened(&self) -> u64 {
        self.inner.lock().map(|i| i.opened).unwrap_or(0)
    }

    /// Requests holding a pass now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_opens_the_breaker_and_one_probe_closes_it() {
        let g = Guard::new(8, Duration::from_secs(5));
        let t0 = Instant::now();
        let pass = g.enter(t0).expect("closed breaker admits");
        g.record(&pass, Verdict::Unhealthy, t0);
        drop(pass);
        assert!(!g.available(t0 + Duration::from_secs(1)));
        assert_eq!(g.enter(t0 + Duration::from_secs(1)).err(), Some(Refusal::BreakerOpen));
        let later = t0 + Duration::from_secs(6);
        assert!(g.available(later));
        let probe = g.enter(later).expect("a probe goes after the open time");
        assert!(probe.probe);
        assert_eq!(g.enter(later).err(), Some(Refusal::BreakerOpen), "only one probe at a time");
        assert!(!g.available(later));
        g.record(&probe, Verdict::Healthy, later);
        assert_eq!(g.state(), BreakerState::Closed);
        assert_eq!(g.times_opened(), 1);
    }

    #[test]
    fn a_failed_probe_opens_it_again_and_caller_errors_do_not_count() {
        let g = Guard::new(8, Duration::from_secs(5));
        let t0 = Instant::now();
        let pass = g.enter(t0).expect("admitted");
        g.record(&pass, Verdict::Neutral, t0);
        assert_eq!(g.state(), BreakerState::Closed);
        g.record(&pass, Verdict::Unhealthy, t0);
        let t1 = t0 + Duration::from_secs(5);
        let probe = g.enter(t1).expect("probe");
        g.record(&probe, Verdict::Unhealthy, t1);
        assert_eq!(g.state(), BreakerState::Open { until: t1 + Duration::from_secs(5) });
    }

    #[test]
    fn the_cap_counts_passes_until_they_drop() {
        let g = Guard::new(2, Duration::from_secs(5));
        let now = Instant::now();
        let a = g.enter(now).expect("first");
        let b = g.enter(now).expect("second");
        assert_eq!(g.enter(now).err(), Some(Refusal::AtCapacity));
        assert!(!g.available(now));
        drop(a);
        assert!(g.available(now));
        assert_eq!(g.in_flight(), 1);
        drop(b);
        assert_eq!(g.in_flight(), 0);
    }
}
