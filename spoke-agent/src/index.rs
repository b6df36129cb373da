//! The precise KV index of one worker set.
//!
//! Backed by `dynamo-kv-router`'s concurrent compressed radix tree (writes on its own thread,
//! reads inline), keyed by the router's hashes of each block's tokens: engine block hashes are
//! kept only as opaque ids for parent links and removals, because engines salt them per
//! process. On top of the tree sits a short-lived *pending* overlay: the blocks a request will
//! create on the worker it was just sent to, so the next request with the same prefix follows
//! it before the engine's `BlockStored` arrives. A booking lasts while its request waits for
//! the engine, however long it queues (its blocks are on their way; the request path releases
//! it if the request fails), and [`PENDING_TTL`] past the request's first token: by then the
//! engine has announced the blocks it wrote, or evicted them.
//!
//! A booking is the routed prompt's whole block sequence, shared with the request (`Arc`), so
//! booking and releasing cost O(1) on the request path, and a lookup matches each booking as
//! a sequence from its first block: a block counts as pending only after the same blocks
//! before it, as in the engine's cache.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dynamo_kv_router::indexer::{KvIndexerInterface, SyncIndexer};
use dynamo_kv_router::protocols::{
    BlockHashOptions, KvCacheEvent, KvCacheEventData, LocalBlockHash, RouterEvent, WorkerId, compute_block_hash_for_seq,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, ThreadPoolIndexer};
// Worker ids are small integers: a hash made for them, not SipHash, on the request path.
use rustc_hash::FxHashMap as HashMap;

use crate::coarse::CoarseCopy;

/// How long a routed request's blocks still count as cached on its worker after its first
/// token, for the engine's own events to arrive: the engine announces a prompt's blocks in the
/// step that computes them, before the first token leaves it.
pub const PENDING_TTL: Duration = Duration::from_secs(5);

/// Upper bound on pending blocks per worker (memory guard): past it the oldest bookings go.
const PENDING_MAX_PER_WORKER: usize = 200_000;

/// The block sequences of requests routed to one worker, oldest first, each with its expiry
/// (`None` while the request has not started).
#[derive(Default)]
struct Pending {
    bookings: VecDeque<(Arc<Vec<LocalBlockHash>>, Option<Instant>)>,
    blocks: usize,
}

fn live(expiry: &Option<Instant>, now: Instant) -> bool {
    expiry.is_none_or(|at| at > now)
}

impl Pending {
    /// Drops expired bookings, then the oldest while over the memory guard.
    fn prune(&mut self, now: Instant) {
        let mut freed = 0;
        self.bookings.retain(|(hashes, expiry)| {
            let keep = live(expiry, now);
            if !keep {
                freed += hashes.len();
            }
            keep
        });
        self.blocks -= freed;
        while self.blocks > PENDING_MAX_PER_WORKER
            && let Some((hashes, _)) = self.bookings.pop_front()
        {
            self.blocks -= hashes.len();
        }
    }

    /// Leading blocks of `hashes` that one live booking shares.
    fn overlap(&self, hashes: &[LocalBlockHash], now: Instant) -> u32 {
        self.bookings
            .iter()
            .filter(|(_, expiry)| live(expiry, now))
            .map(|(booked, _)| booked.iter().zip(hashes).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0) as u32
    }
}

/// The KV index of one worker set.
pub struct KvIndex {
    tree: ThreadPoolIndexer<ConcurrentRadixTreeCompressed>,
    block_size: u32,
    coarse: CoarseCopy,
    pending: Mutex<HashMap<WorkerId, Pending>>,
}

impl std::fmt::Debug for KvIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvIndex").field("block_size", &self.block_size).finish()
    }
}

impl KvIndex {
    /// An empty index for blocks of `block_size` tokens.
    pub fn new(block_size: u32) -> KvIndex {
        KvIndex {
            tree: ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, block_size),
            block_size,
            coarse: CoarseCopy::new(switchyard_proto::coarse::DEFAULT_FACTOR),
            pending: Mutex::new(HashMap::default()),
        }
    }

    /// The coarse copy the spoke reports to the hub, fed the same events.
    pub fn coarse(&self) -> &CoarseCopy {
        &self.coarse
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The router's hashes of the full blocks of `tokens`.
    pub fn hashes(&self, tokens: &[u32]) -> Vec<LocalBlockHash> {
        compute_block_hash_for_seq(tokens, self.block_size, BlockHashOptions::default())
    }

    /// Leading blocks of `hashes` cached on each worker, in one walk of the tree: what the
    /// engines announced, and that plus the pending blocks of requests just routed. Workers
    /// with none are omitted.
    pub fn lookup(&self, hashes: &[LocalBlockHash]) -> Overlaps {
        self.lookup_at(hashes, Instant::now())
    }

    fn lookup_at(&self, hashes: &[LocalBlockHash], now: Instant) -> Overlaps {
        let scores = self.tree.backend().find_matches(hashes, false);
        let mut indexed: HashMap<WorkerId, u32> =
            HashMap::with_capacity_and_hasher(scores.scores.len(), Default::default());
        indexed.extend(scores.scores.iter().filter(|(_, n)| **n > 0).map(|(w, n)| (w.worker_id, *n)));
        let mut with_pending = HashMap::with_capacity_and_hasher(indexed.len() + 4, Default::default());
        with_pending.extend(indexed.iter().map(|(w, n)| (*w, *n)));
        if let Ok(pending) = self.pending.lock() {
            for (worker, booked) in pending.iter() {
                let n = booked.overlap(hashes, now);
                if n > 0 {
                    let e = with_pending.entry(*worker).or_insert(0);
                    *e = (*e).max(n);
                }
            }
        }
        Overlaps { indexed, with_pending }
    }

    /// Applies one event (asynchronously, in order per worker).
    pub fn apply(&self, event: RouterEvent) {
        self.coarse.apply(&event);
        if let Err(e) = self.tree.enqueue_event(event) {
            tracing::warn!(error = %e, "kv index dropped an event");
        }
    }

    /// Drops everything known about `worker` (resync after an unrecoverable gap or restart).
    pub fn clear_worker(&self, worker: WorkerId, event_id: u64) {
        self.apply(RouterEvent::new(worker, KvCacheEvent { event_id, data: KvCacheEventData::Cleared, dp_rank: 0 }));
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&worker);
        }
    }

    /// Forgets a worker that left the configuration.
    pub async fn remove_worker(&self, worker: WorkerId) {
        self.tree.remove_worker(worker).await;
        self.coarse.clear_worker(worker);
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&worker);
        }
    }

    /// Records that `worker` is about to cache `hashes` (the request just routed there).
    pub fn book(&self, worker: WorkerId, hashes: &Arc<Vec<LocalBlockHash>>) {
        if hashes.is_empty() {
            return;
        }
        let now = Instant::now();
        if let Ok(mut p) = self.pending.lock() {
            let pending = p.entry(worker).or_default();
            pending.blocks += hashes.len();
            pending.bookings.push_back((hashes.clone(), None));
            pending.prune(now);
        }
    }

    /// The request that booked `hashes` on `worker` got its first token: the booking now
    /// expires after [`PENDING_TTL`].
    pub fn started(&self, worker: WorkerId, hashes: &Arc<Vec<LocalBlockHash>>) {
        if let Ok(mut p) = self.pending.lock()
            && let Some(pending) = p.get_mut(&worker)
            && let Some((_, expiry)) =
                pending.bookings.iter_mut().rev().find(|(booked, at)| at.is_none() && Arc::ptr_eq(booked, hashes))
        {
            *expiry = Some(Instant::now() + PENDING_TTL);
        }
    }

    /// Forgets the booking of `hashes` on `worker` (the request failed before reaching the
    /// engine): the one made with this very sequence.
    pub fn unbook(&self, worker: WorkerId, hashes: &Arc<Vec<LocalBlockHash>>) {
        if let Ok(mut p) = self.pending.lock()
            && let Some(pending) = p.get_mut(&worker)
            && let Some(i) = pending.bookings.iter().rposition(|(booked, _)| Arc::ptr_eq(booked, hashes))
            && let Some((booked, _)) = pending.bookings.remove(i)
        {
            pending.blocks -= booked.len();
        }
    }

    /// Waits until every queued event is applied (tests, debug endpoints).
    pub async fn flush(&self) {
        let _ = self.tree.flush_and_wait().await;
    }
}

/// Leading cached blocks of one prompt per worker (workers with none omitted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overlaps {
    /// As the engines' events announced them.
    pub indexed: HashMap<WorkerId, u32>,
    /// Counting pending blocks too: what routing uses.
    pub with_pending: HashMap<WorkerId, u32>,
}

#[cfg(test)]
mod tests {
    use dynamo_kv_router::zmq_wire::ZmqEventNormalizer;
    use switchyard_sim::engine::KvEvent;
    use switchyard_sim::wire::{WireFormat, encode_batch};

    use super::*;
    use crate::kv_subscriber::decode_batch;

    fn announce(index: &KvIndex, worker: WorkerId, tokens: &[u32]) {
        let bs = index.block_size();
        let blocks = tokens.len() as u32 / bs;
        let ev = KvEvent::BlockStored {
            block_hashes: (0..u64::from(blocks)).map(|b| (worker << 32) | (b + 1)).collect(),
            parent_block_hash: None,
            token_ids: tokens[..(blocks * bs) as usize].to_vec(),
            block_size: bs,
        };
        let mut normalizer = ZmqEventNormalizer::new(bs);
        let batch = decode_batch(&mut normalizer, worker, &mut 0, &encode_batch(0.0, &[ev], 0, WireFormat::Current))
            .expect("decodes");
        for e in batch.events {
            index.apply(e);
        }
    }

    #[tokio::test]
    async fn one_lookup_reports_announced_and_pending_blocks_apart() {
        let index = KvIndex::new(4);
        let tokens: Vec<u32> = (0..40).collect();
        announce(&index, 1, &tokens[..24]);
        index.flush().await;
        let hashes = index.hashes(&tokens);
        assert_eq!(hashes.len(), 10);
        let only = |pairs: &[(WorkerId, u32)]| pairs.iter().copied().collect::<HashMap<_, _>>();

        let o = index.lookup(&hashes);
        assert_eq!(o, Overlaps { indexed: only(&[(1, 6)]), with_pending: only(&[(1, 6)]) });

        // A request just routed to worker 2 with the first 8 blocks, and one to worker 1 with
        // all 10: routing sees both, the announced figures do not move.
        let (first_eight, all) = (Arc::new(hashes[..8].to_vec()), Arc::new(hashes.clone()));
        index.book(2, &first_eight);
        index.book(1, &all);
        let o = index.lookup(&hashes);
        assert_eq!(o.indexed, only(&[(1, 6)]));
        assert_eq!(o.with_pending, only(&[(1, 10), (2, 8)]));

        // Released bookings leave only what the engine announced.
        // Releasing an equal sequence that was never booked changes nothing.
        index.unbook(2, &Arc::new(hashes[..8].to_vec()));
        assert_eq!(index.lookup(&hashes).with_pending, only(&[(1, 10), (2, 8)]));
        index.unbook(1, &all);
        index.unbook(2, &first_eight);
        assert_eq!(index.lookup(&hashes), Overlaps { indexed: only(&[(1, 6)]), with_pending: only(&[(1, 6)]) });

        // A prompt diverging in its first block matches nothing anywhere.
        let mut other = tokens.clone();
        other[0] = 99;
        assert_eq!(index.lookup(&index.hashes(&other)), Overlaps::default());
    }

    #[test]
    fn a_booking_lasts_while_its_request_queues_and_expires_after_its_first_token() {
        let index = KvIndex::new(4);
        let (queued, answered) =
            (Arc::new(vec![LocalBlockHash(1), LocalBlockHash(2)]), Arc::new(vec![LocalBlockHash(7)]));
        index.book(1, &queued);
        index.book(1, &answered);
        index.started(1, &answered);
        let now = Instant::now();
        let pending =
            |hashes: &[LocalBlockHash], at: Instant| index.lookup_at(hashes, at).with_pending.get(&1).copied();
        assert_eq!(pending(&answered, now), Some(1));
        assert_eq!(pending(&answered, now + PENDING_TTL + Duration::from_secs(1)), None);
        // Queued for an hour, it still counts: its blocks are on their way.
        assert_eq!(pending(&queued, now + Duration::from_secs(3_600)), Some(2));
        index.started(1, &queued);
        assert_eq!(pending(&queued, now + Duration::from_secs(3_600)), None);
        // Expired bookings are pruned at the next booking and leave the guard's count.
        let later = Arc::new(vec![LocalBlockHash(9)]);
        index.book(1, &later);
        let p = index.pending.lock().expect("lock");
        assert_eq!(p[&1].bookings.len(), 3, "nothing expired yet at the real clock");
    }

    #[test]
    fn the_memory_guard_drops_the_oldest_bookings_first() {
        let index = KvIndex::new(4);
        let seq = |first: u64| Arc::new((first..first + 90_000).map(LocalBlockHash).collect::<Vec<_>>());
        let (a, b, c) = (seq(0), seq(1_000_000), seq(2_000_000));
        index.book(1, &a);
        index.book(1, &b);
        assert_eq!(index.lookup(&a).with_pending.get(&1), Some(&90_000));
        index.book(1, &c);
        assert_eq!(index.lookup(&a).with_pending.get(&1), None, "over 200,000 pending blocks, the oldest went");
        assert_eq!(index.lookup(&b).with_pending.get(&1), Some(&90_000));
        assert_eq!(index.lookup(&c).with_pending.get(&1), Some(&90_000));
    }
}
