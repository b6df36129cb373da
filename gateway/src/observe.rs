//! Response observers and bookings: what the request path tells the rest of the system about
//! each dispatched request.
//!
//! Invariants:
//! - observers are a list handed over by the planner per dispatch, not hard-wired calls: the
//!   spoke registers calibration, fidelity and its load ledger; the hub adds the limiter and
//!   the ledger;
//! - every dispatch ends exactly once: [`Observer::end`] is called with the outcome, also
//!   when the client goes away (the relay's drop guard reports `Cancelled`);
//! - a [`Booking`] is released when dropped unless the request completed: a failed upstream
//!   never keeps a reservation (e.g. predicted cache blocks) that nothing will fill; it is told
//!   when the engine started answering ([`Release::started`]), however long the request
//!   queued before that.

use std::time::Duration;

use crate::event::Usage;

/// How a dispatch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The response completed normally.
    Completed,
    /// No connection could be made.
    ConnectFailed,
    /// The upstream failed (error answer, broken or truncated stream, timeout).
    Failed,
    /// The client went away or the server ended the stream while draining.
    Cancelled,
}

/// Something that watches one dispatched request.
pub trait Observer: Send {
    /// The first generated token (or the first event) arrived after `elapsed`.
    fn first_token(&mut self, _elapsed: Duration) {}
    /// `generated` content events (streamed engine steps: about one token each) have arrived,
    /// the first one included; called for every one after the first.
    fn progress(&mut self, _generated: u32) {}
    /// The engine reported token counts.
    fn usage(&mut self, _usage: &Usage) {}
    /// The dispatch ended.
    fn end(&mut self, _outcome: Outcome) {}
}

/// Releases a reservation.
pub trait Release: Send {
    /// Gives the reservation back.
    fn release(self: Box<Self>);
    /// The engine produced the first token (or the request completed): the reserved work is
    /// done, so the reservation need only outlive the engine's own report of it.
    fn started(&self) {}
}

/// A reservation made for one dispatch, released on drop unless kept.
#[must_use = "a booking is released when dropped"]
pub struct Booking(Option<Box<dyn Release>>);

impl Booking {
    /// A booking released by `release`.
    pub fn new(release: Box<dyn Release>) -> Booking {
        Booking(Some(release))
    }

    /// A booking that reserves nothing.
    pub fn none() -> Booking {
        Booking(None)
    }

    /// The engine started answering: see [`Release::started`].
    pub fn started(&self) {
        if let Some(r) = &self.0 {
            r.started();
        }
    }

    /// The request completed: the reservation stays (it expires or is confirmed by itself).
    pub fn keep(mut self) {
        if let Some(r) = self.0.take() {
            r.started();
        }
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.release();
        }
    }
}

impl std::fmt::Debug for Booking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Booking(held)" } else { "Booking(none)" })
    }
}

/// What a planner hands the relay for one dispatch.
pub struct Dispatch {
    /// Released unless the request completes.
    pub booking: Booking,
    /// Watchers of this dispatch.
    pub observers: Vec<Box<dyn Observer>>,
}

impl Dispatch {
    /// A dispatch with nothing booked and no observers.
    pub fn bare() -> Dispatch {
        Dispatch { booking: Booking::none(), observers: Vec::new() }
    }

    pub(crate) fn first_token(&mut self, elapsed: Duration) {
        self.booking.started();
        for o in &mut self.observers {
            o.first_token(elapsed);
        }
    }

    pub(crate) fn progress(&mut self, generated: u32) {
        for o in &mut self.observers {
            o.progress(generated);
        }
    }

    pub(crate) fn usage(&mut self, usage: &Usage) {
        for o in &mut self.observers {
            o.usage(usage);
        }
    }

    /// Ends the dispatch: observers see the outcome; the booking is kept only on success.
    pub(crate) fn end(self, outcome: Outcome) {
        let Dispatch { booking, mut observers } = self;
        for o in &mut observers {
            o.end(outcome);
        }
        if outcome == Outcome::Completed {
            booking.keep();
        }
    }
}

/// Ends a dispatch with `Cancelled` if it is dropped before being ended (client gone).
pub(crate) struct DispatchGuard(pub(crate) Option<Dispatch>);

impl DispatchGuard {
    pub(crate) fn get(&mut self) -> Option<&mut Dispatch> {
        self.0.as_mut()
    }

    pub(crate) fn end(&mut self, outcome: Outcome) {
        if let Some(d) = self.0.take() {
            d.end(outcome);
        }
    }
}

impl Drop for DispatchGuard {
    fn drop(&mut self) {
        self.end(Outcome::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    struct Count(Arc<AtomicU32>);
    impl Release for Count {
        fn release(self: Box<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Counts `started` calls (high half) and releases (low half).
    struct Starts(Arc<AtomicU32>);
    impl Release for Starts {
        fn release(self: Box<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn started(&self) {
            self.0.fetch_add(1 << 16, Ordering::SeqCst);
        }
    }

    #[test]
    fn bookings_learn_when_the_engine_started_answering() {
        let seen = Arc::new(AtomicU32::new(0));
        let booking = || Booking::new(Box::new(Starts(seen.clone())));
        // A first token starts it; completing keeps it (started again, never released).
        let mut d = Dispatch { booking: booking(), observers: Vec::new() };
        d.first_token(Duration::from_millis(5));
        assert_eq!(seen.load(Ordering::SeqCst), 1 << 16);
        d.end(Outcome::Completed);
        assert_eq!(seen.load(Ordering::SeqCst), 2 << 16);
        // Failing after the first token still releases it; failing before never starts it.
        let mut d = Dispatch { booking: booking(), observers: Vec::new() };
        d.first_token(Duration::from_millis(5));
        d.end(Outcome::Failed);
        assert_eq!(seen.load(Ordering::SeqCst), (3 << 16) + 1);
        Dispatch { booking: booking(), observers: Vec::new() }.end(Outcome::Cancelled);
        assert_eq!(seen.load(Ordering::SeqCst), (3 << 16) + 2);
    }

    #[test]
    fn bookings_are_released_unless_the_request_completed() {
        let released = Arc::new(AtomicU32::new(0));
        for (outcome, expected) in
            [(Outcome::Completed, 0), (Outcome::Failed, 1), (Outcome::ConnectFailed, 2), (Outcome::Cancelled, 3)]
        {
            let d = Dispatch { booking: Booking::new(Box::new(Count(released.clone()))), observers: Vec::new() };
            d.end(outcome);
            assert_eq!(released.load(Ordering::SeqCst), expected);
        }
        let guard = DispatchGuard(Some(Dispatch {
            booking: Booking::new(Box::new(Count(released.clone()))),
            observers: Vec::new(),
        }));
        drop(guard);
        assert_eq!(released.load(Ordering::SeqCst), 4);
    }
}
