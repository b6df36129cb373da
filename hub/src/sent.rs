//! Requests the hub has sent to each cluster's worker set since that cluster's last report:
//! the part of the load the hub knows and the report cannot show yet.
//!
//! Between two reports (every 500 ms by default) every request would otherwise be planned on
//! the same figures, and a burst would follow the one cluster that looked best. Each dispatch
//! is counted against its (cluster, set) pair with the cluster's report count at that moment;
//! planning adds the pair's count (and prompt tokens) to the reported queue, and a newer
//! report from the cluster — which accounts for what it received — clears it.
//!
//! A request the hub sees progress leaves the count early: its prompt tokens once its first
//! token arrives (the prefill is done), the request itself when it ends — but only while the
//! count it was added to stands, since a newer report already shows it.
//!
//! Invariants: counts only grow between two reports of a cluster, apart from requests the
//! hub saw prefilled or ended, and are dropped at its next one (or when it is no longer
//! live); the ledger is one small map behind a mutex held for
//! no more than one insert or one pass over the live clusters, never across an await.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchyard_gateway::observe::{Observer, Outcome};

use crate::batch::SetOfCluster;
use crate::fleet::LiveCluster;

/// What a pair was sent since its cluster's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Requests.
    pub requests: u32,
    /// Their prompt tokens not yet prefilled that the prefix index does not hold where
    /// they were sent (estimated when the hub has no tokenizer for the set).
    pub prompt_tokens: u64,
}

#[derive(Debug, Default)]
struct Entry {
    /// The cluster's report count when the first of these was sent.
    reports: u64,
    sent: Sent,
}

/// The ledger.
#[derive(Debug, Default)]
pub struct SentSinceReport {
    pairs: Mutex<HashMap<SetOfCluster, Entry>>,
}

impl SentSinceReport {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<SetOfCluster, Entry>) -> R) -> R {
        match self.pairs.lock() {
            Ok(mut p) => f(&mut p),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// Counts one request of `prompt_tokens` sent to `pair`, whose cluster had sent
    /// `reports` reports when it was planned.
    pub fn record(&self, pair: SetOfCluster, reports: u64, prompt_tokens: u32) {
        self.with(|p| {
            let e = p.entry(pair).or_default();
            if e.reports < reports {
                // A newer report than the one these were counted against: it shows them.
                *e = Entry { reports, sent: Sent::default() };
            }
            e.sent.requests += 1;
            e.sent.prompt_tokens += u64::from(prompt_tokens);
        });
    }

    /// A request counted by [`SentSinceReport::record`] with `reports` made progress:
    /// `prefilled` prompt tokens and, when `ended`, the request itself leave the count —
    /// if the count still holds them (no newer report of the cluster started a new one).
    pub fn progressed(&self, pair: &SetOfCluster, reports: u64, prefilled: u32, ended: bool) {
        self.with(|p| {
            if let Some(e) = p.get_mut(pair).filter(|e| e.reports == reports) {
                e.sent.prompt_tokens = e.sent.prompt_tokens.saturating_sub(u64::from(prefilled));
                if ended {
                    e.sent.requests = e.sent.requests.saturating_sub(1);
                }
            }
        });
    }

    /// What each pair of the `live` clusters was sent since the report planning sees now;
    /// entries of clusters that reported since, or are no longer live, are dropped.
    pub fn since_reports(&self, live: &[LiveCluster]) -> HashMap<SetOfCluster, Sent> {
        self.with(|p| {
            p.retain(|(cluster, _), e| live.iter().any(|c| c.cluster == *cluster && c.reports <= e.reports));
            p.iter().map(|(k, e)| (k.clone(), e.sent)).collect()
        })
    }
}

/// Watches one dispatch counted in the ledger and takes it out as it progresses.
pub struct SentObserver {
    /// The ledger.
    pub ledger: Arc<SentSinceReport>,
    /// Where it was sent.
    pub pair: SetOfCluster,
    /// Its cluster's report count when it was counted.
    pub reports: u64,
    /// The prompt tokens it was counted with (zeroed once they leave the count).
    pub prompt_tokens: u32,
}

impl Observer for SentObserver {
    fn first_token(&mut self, _elapsed: Duration) {
        self.ledger.progressed(&self.pair, self.reports, std::mem::take(&mut self.prompt_tokens), false);
    }

    fn end(&mut self, _outcome: Outcome) {
        self.ledger.progressed(&self.pair, self.reports, std::mem::take(&mut self.prompt_tokens), true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_seen_prefilled_or_ended_leaves_the_count_until_the_next_report() {
        let ledger = Arc::new(SentSinceReport::default());
        let pair = ("east".to_owned(), "set".to_owned());
        let live = [LiveCluster::reported("east", 4)];
        ledger.record(pair.clone(), 4, 100);
        ledger.record(pair.clone(), 4, 50);
        let mut first = SentObserver { ledger: ledger.clone(), pair: pair.clone(), reports: 4, prompt_tokens: 100 };
        first.first_token(Duration::from_millis(3));
        assert_eq!(ledger.since_reports(&live)[&pair], Sent { requests: 2, prompt_tokens: 50 }, "prefilled");
        first.end(Outcome::Completed);
        assert_eq!(ledger.since_reports(&live)[&pair], Sent { requests: 1, prompt_tokens: 50 }, "ended, once");
        // A request that fails before its first token leaves with its prompt.
        let mut second = SentObserver { ledger: ledger.clone(), pair: pair.clone(), reports: 4, prompt_tokens: 50 };
        second.end(Outcome::Failed);
        assert_eq!(ledger.since_reports(&live)[&pair], Sent::default());
        // Counted against an older report: the newer count is not touched.
        ledger.record(pair.clone(), 5, 70);
        let mut old = SentObserver { ledger: ledger.clone(), pair: pair.clone(), reports: 4, prompt_tokens: 100 };
        old.end(Outcome::Completed);
        let live = [LiveCluster::reported("east", 5)];
        assert_eq!(ledger.since_reports(&live)[&pair], Sent { requests: 1, prompt_tokens: 70 });
    }

    #[test]
    fn sends_count_until_the_clusters_next_report() {
        let ledger = SentSinceReport::default();
        let pair = |c: &str| (c.to_owned(), "set".to_owned());
        ledger.record(pair("east"), 4, 100);
        ledger.record(pair("east"), 4, 50);
        ledger.record(pair("west"), 9, 10);
        let now = ledger.since_reports(&[LiveCluster::reported("east", 4), LiveCluster::reported("west", 9)]);
        assert_eq!(now[&pair("east")], Sent { requests: 2, prompt_tokens: 150 });
        assert_eq!(now[&pair("west")], Sent { requests: 1, prompt_tokens: 10 });
        // East reports again: its report shows those two. West is gone.
        let now = ledger.since_reports(&[LiveCluster::reported("east", 5)]);
        assert!(now.is_empty(), "{now:?}");
        // A send planned on the newer report starts a new count.
        ledger.record(pair("east"), 5, 7);
        ledger.record(pair("east"), 6, 3);
        let now = ledger.since_reports(&[LiveCluster::reported("east", 6)]);
        assert_eq!(now[&pair("east")], Sent { requests: 1, prompt_tokens: 3 });
    }
}
