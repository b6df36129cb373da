//! The hub's batch queue: `batch`-class requests whose policy queues them (`onEmpty: Queue`,
//! e.g. "only worker sets below 70 % KV usage") wait here, off the interactive path, and are
//! dispatched oldest first as capacity appears.
//!
//! Invariants:
//! - interactive requests never enter it, and nothing in it holds a lock while a request
//!   plans: the queue delays only the batch requests in it;
//! - strict order: only the oldest waiting request plans (on every change of the fleet view
//!   or of the line); the ones behind it wait, so requests leave oldest first;
//! - a worker set that took a batch request is not offered another until a newer report from
//!   its cluster (the report the dispatch was decided on cannot show its effect), so a burst
//!   of capacity is not overfilled on one stale figure;
//! - a request leaves the line when dispatched, after `max_wait` (a clear error), or when its
//!   client goes away (its [`Place`] is dropped with the request's future).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

use crate::fleet::LiveCluster;

/// A (cluster, worker set) pair.
pub type SetOfCluster = (String, String);

#[derive(Default)]
struct Line {
    next: u64,
    waiting: VecDeque<u64>,
    /// Pairs that took a request, with their cluster's report count at the time.
    taken: HashMap<SetOfCluster, u64>,
}

/// The queue.
pub struct BatchQueue {
    max_wait: Duration,
    line: Mutex<Line>,
    moved: watch::Sender<u64>,
}

/// One request's place in line; leaving (drop) lets the next one plan.
pub struct Place<'a> {
    queue: &'a BatchQueue,
    ticket: u64,
}

impl BatchQueue {
    /// An empty queue whose requests wait at most `max_wait`.
    pub fn new(max_wait: Duration) -> BatchQueue {
        BatchQueue { max_wait, line: Mutex::new(Line::default()), moved: watch::Sender::new(0) }
    }

    /// How long a request may wait.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    fn with<R>(&self, f: impl FnOnce(&mut Line) -> R) -> R {
        match self.line.lock() {
            Ok(mut l) => f(&mut l),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// Joins the end of the line.
    pub fn join(&self) -> Place<'_> {
        let ticket = self.with(|l| {
            l.next += 1;
            l.waiting.push_back(l.next);
            l.next
        });
        Place { queue: self, ticket }
    }

    /// Requests waiting now.
    pub fn depth(&self) -> usize {
        self.with(|l| l.waiting.len())
    }

    /// Pairs of `live` that took a request and have not reported since.
    pub fn taken(&self, live: &[LiveCluster]) -> BTreeSet<SetOfCluster> {
        self.with(|l| {
            l.taken.retain(|(cluster, _), at| live.iter().any(|c| c.cluster == *cluster && c.reports <= *at));
            l.taken.keys().cloned().collect()
        })
    }

    /// Records that `pair` took a request on the strength of its cluster's `reports`-th report.
    pub fn take(&self, pair: SetOfCluster, reports: u64) {
        self.with(|l| {
            l.taken.insert(pair, reports);
        });
    }
}

impl Place<'_> {
    /// Whether this request is the oldest in line (the one that plans).
    pub fn is_head(&self) -> bool {
        self.queue.with(|l| l.waiting.front() == Some(&self.ticket))
    }

    /// A receiver that sees a new value whenever someone leaves the line.
    pub fn moved(&self) -> watch::Receiver<u64> {
        self.queue.moved.subscribe()
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let ticket = self.ticket;
        self.queue.with(|l| l.waiting.retain(|t| *t != ticket));
        self.queue.moved.send_modify(|v| *v += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_plans_and_leaving_passes_the_turn_on() {
        let q = BatchQueue::new(Duration::from_secs(1));
        let (a, b, c) = (q.join(), q.join(), q.join());
        assert!(a.is_head() && !b.is_head() && !c.is_head());
        let moved = c.moved();
        drop(b); // a client that went away leaves from the middle
        assert!(moved.has_changed().unwrap_or(false));
        assert!(a.is_head() && !c.is_head());
        drop(a);
        assert!(c.is_head());
        assert_eq!(q.depth(), 1);
    }

    #[test]
    fn a_set_that_took_a_request_waits_for_a_newer_report() {
        let q = BatchQueue::new(Duration::from_secs(1));
        q.take(("east".into(), "a".into()), 5);
        assert_eq!(q.taken(&[LiveCluster::reported("east", 5)]).len(), 1, "no report since");
        assert!(q.taken(&[LiveCluster::reported("east", 6)]).is_empty(), "a newer report shows the effect");
        q.take(("west".into(), "b".into()), 2);
        assert!(q.taken(&[]).is_empty(), "a cluster gone is not remembered");
    }
}
