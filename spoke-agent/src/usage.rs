//! Usage records of the requests this spoke served, on their way to the hub.
//!
//! Every dispatch to a worker that reached it (completed, failed or cancelled; a connection
//! refused is the next target's business) ends in one [`UsageRecord`] in the [`UsageOutbox`].
//! The hub link sends what it has not sent on its stream yet after each load report, and
//! forgets records only when the hub acknowledges them; a new stream starts again from the
//! oldest unacknowledged one. The hub applies a record only if its sequence is above the
//! highest it applied for this instance, so a record resent is never counted twice.
//!
//! Invariants: sequences increase by one per record of an instance (a process run);
//! recording never blocks or fails a request; the outbox is bounded ([`MAX_PENDING`]): past
//! it the oldest records are dropped and counted (`/status` `hub.usage.dropped`), never the
//! request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use switchyard_gateway::event::Usage;
use switchyard_gateway::observe::{Observer, Outcome};
use switchyard_proto::v1::UsageRecord;

/// Records the outbox holds at most while the hub is away (about 40 MB).
pub const MAX_PENDING: usize = 200_000;

/// Records per usage report at most (well under gRPC's 4 MiB message limit).
pub const MAX_PER_REPORT: usize = 5_000;

/// Unacknowledged usage records.
#[derive(Debug)]
pub struct UsageOutbox {
    instance: u64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    pending: VecDeque<UsageRecord>,
    dropped: u64,
    acknowledged: u64,
}

/// The outbox's counters, for `/status`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OutboxStatus {
    /// This process run's instance id.
    pub instance: u64,
    /// Records recorded since start.
    pub recorded: u64,
    /// Records the hub has acknowledged.
    pub acknowledged: u64,
    /// Records waiting for the hub.
    pub pending: usize,
    /// Records dropped because the outbox was full.
    pub dropped: u64,
}

impl UsageOutbox {
    /// An empty outbox for instance `instance`.
    pub fn new(instance: u64) -> UsageOutbox {
        UsageOutbox { instance, inner: Mutex::new(Inner { next: 1, ..Inner::default() }) }
    }

    /// An empty outbox with a fresh random instance id.
    pub fn fresh() -> UsageOutbox {
        // Distinct per run (a restarted spoke's sequences start again at 1): the standard
        // library seeds every `RandomState` from the OS's randomness.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        UsageOutbox::new(h.finish())
    }

    /// This process run's id.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        match self.inner.lock() {
            Ok(mut g) => f(&mut g),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// Adds `record`, giving it the next sequence.
    pub fn push(&self, mut record: UsageRecord) {
        self.with(|s| {
            record.sequence = s.next;
            s.next += 1;
            if s.pending.len() >= MAX_PENDING {
                s.pending.pop_front();
                s.dropped += 1;
            }
            s.pending.push_back(record);
        });
    }

    /// Up to `max` pending records with a sequence above `sent_through`, oldest first.
    pub fn after(&self, sent_through: u64, max: usize) -> Vec<UsageRecord> {
        self.with(|s| {
            // Sequences are consecutive in `pending`: skip straight to the first one wanted.
            let first = s.pending.front().map_or(0, |r| r.sequence);
            let skip = sent_through.saturating_add(1).saturating_sub(first) as usize;
            s.pending.iter().skip(skip).take(max).cloned().collect()
        })
    }

    /// The hub applied every record up to `through`.
    pub fn acknowledge(&self, through: u64) {
        self.with(|s| {
            while s.pending.front().is_some_and(|r| r.sequence <= through) {
                s.pending.pop_front();
                s.acknowledged += 1;
            }
        });
    }

    /// Counters now.
    pub fn status(&self) -> OutboxStatus {
        self.with(|s| OutboxStatus {
            instance: self.instance,
            recorded: s.next - 1,
            acknowledged: s.acknowledged,
            pending: s.pending.len(),
            dropped: s.dropped,
        })
    }
}

/// Watches one dispatch and records it in the outbox when it ends.
pub struct UsageObserver {
    /// Where the record goes.
    pub outbox: Arc<UsageOutbox>,
    /// The record so far (ids, model, target).
    pub record: UsageRecord,
    /// When the dispatch began.
    pub started: Instant,
    /// Time to its first token, once it came.
    pub ttft: Option<Duration>,
}

impl Observer for UsageObserver {
    fn first_token(&mut self, elapsed: Duration) {
        self.ttft = Some(elapsed);
    }

    fn usage(&mut self, usage: &Usage) {
        self.record.prompt_tokens = usage.prompt_tokens;
        self.record.cached_tokens = usage.cached_tokens;
        self.record.completion_tokens = usage.completion_tokens;
    }

    fn end(&mut self, outcome: Outcome) {
        let outcome = match outcome {
            Outcome::Completed => "completed",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            // Nothing was served: the relay tries the next target, which records its own.
            Outcome::ConnectFailed => return,
        };
        let mut record = std::mem::take(&mut self.record);
        record.outcome = outcome.to_owned();
        record.ttft_ms = self.ttft.map_or(0.0, |t| t.as_secs_f64() * 1000.0);
        record.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        record.ended_unix_ms =
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.outbox.push(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> UsageRecord {
        UsageRecord { request_id: id.into(), ..UsageRecord::default() }
    }

    #[test]
    fn records_are_numbered_resent_until_acknowledged_and_then_forgotten() {
        let outbox = UsageOutbox::new(7);
        for i in 0..5 {
            outbox.push(record(&format!("r{i}")));
        }
        let seqs = |v: Vec<UsageRecord>| v.into_iter().map(|r| r.sequence).collect::<Vec<_>>();
        assert_eq!(seqs(outbox.after(0, 10)), [1, 2, 3, 4, 5]);
        assert_eq!(seqs(outbox.after(3, 10)), [4, 5], "what a stream has sent is not sent again on it");
        assert_eq!(seqs(outbox.after(0, 2)), [1, 2]);
        outbox.acknowledge(3);
        // A new stream starts from the oldest unacknowledged record.
        assert_eq!(seqs(outbox.after(0, 10)), [4, 5]);
        assert_eq!(seqs(outbox.after(4, 10)), [5]);
        outbox.acknowledge(5);
        assert!(outbox.after(0, 10).is_empty());
        assert_eq!(outbox.status(), OutboxStatus { instance: 7, recorded: 5, acknowledged: 5, pending: 0, dropped: 0 });
    }

    #[test]
    fn a_full_outbox_drops_its_oldest_records_and_counts_them() {
        let outbox = UsageOutbox::new(1);
        for i in 0..MAX_PENDING + 3 {
            outbox.push(record(&i.to_string()));
        }
        let st = outbox.status();
        assert_eq!((st.pending, st.dropped), (MAX_PENDING, 3));
        assert_eq!(outbox.after(0, 1)[0].sequence, 4, "the three oldest went");
    }

    #[test]
    fn a_dispatch_is_recorded_once_with_its_usage_and_a_refused_connection_not_at_all() {
        let outbox = Arc::new(UsageOutbox::new(1));
        let observer = |id: &str| UsageObserver {
            outbox: outbox.clone(),
            record: UsageRecord { request_id: id.into(), worker: "w0".into(), ..UsageRecord::default() },
            started: Instant::now(),
            ttft: None,
        };
        let mut served = observer("a");
        served.first_token(Duration::from_millis(12));
        served.usage(&Usage { prompt_tokens: 100, completion_tokens: 7, cached_tokens: 64, cache_write_tokens: 0 });
        served.end(Outcome::Completed);
        let mut refused = observer("b");
        refused.end(Outcome::ConnectFailed);
        let got = outbox.after(0, 10);
        assert_eq!(got.len(), 1);
        let r = &got[0];
        assert_eq!((r.request_id.as_str(), r.outcome.as_str(), r.worker.as_str()), ("a", "completed", "w0"));
        assert_eq!((r.prompt_tokens, r.cached_tokens, r.completion_tokens), (100, 64, 7));
        assert!((r.ttft_ms - 12.0).abs() < 1e-9 && r.duration_ms >= 0.0 && r.ended_unix_ms > 0, "{r:?}");
    }
}
