//! The precise KV index of one worker set.
//!
//! Backed by `dynamo-kv-router`'s concurrent compressed radix tree (writes on its own thread,
//! reads inline), keyed by the router's hashes of each block's tokens: engine block hashes are
//! kept only as opaque ids for parent links and removals, because engines salt them per
//! process. On top of the tree sits a short-lived *pending* overlay: the blocks a request will
//! create on the worker it was just sent to, so the next request with the same prefix follows
//! it before the engine's `BlockStored` arrives. Pending entries expire after
//! [`PENDING_TTL`]; by then the engine has either announced the blocks or evicted them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dynamo_kv_router::indexer::{KvIndexerInterface, SyncIndexer};
use dynamo_kv_router::protocols::{
    BlockHashOptions, KvCacheEvent, KvCacheEventData, LocalBlockHash, RouterEvent, WorkerId, WorkerWithDpRank,
    compute_block_hash_for_seq,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, ThreadPoolIndexer};

/// How long a routed request's blocks count as cached on its worker before the engine's own
/// events confirm them.
pub const PENDING_TTL: Duration = Duration::from_secs(20);

/// Upper bound on pending blocks per worker (memory guard).
const PENDING_MAX_PER_WORKER: usize = 200_000;

/// The KV index of one worker set.
pub struct KvIndex {
    tree: ThreadPoolIndexer<ConcurrentRadixTreeCompressed>,
    block_size: u32,
    pending: Mutex<HashMap<WorkerId, HashMap<u64, Instant>>>,
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
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The router's hashes of the full blocks of `tokens`.
    pub fn hashes(&self, tokens: &[u32]) -> Vec<LocalBlockHash> {
        compute_block_hash_for_seq(tokens, self.block_size, BlockHashOptions::default())
    }

    /// Leading blocks of `hashes` cached on each worker (index or pending), workers with none
    /// omitted.
    pub fn overlaps(&self, hashes: &[LocalBlockHash]) -> HashMap<WorkerId, u32> {
        let scores = self.tree.backend().find_matches(hashes, false);
        let mut out: HashMap<WorkerId, u32> = scores.scores.iter().map(|(w, n)| (w.worker_id, *n)).collect();
        let now = Instant::now();
        if let Ok(pending) = self.pending.lock() {
            for (worker, blocks) in pending.iter() {
                let n = hashes.iter().take_while(|h| blocks.get(&h.0).is_some_and(|exp| *exp > now)).count() as u32;
                let e = out.entry(*worker).or_insert(0);
                *e = (*e).max(n);
            }
        }
        out.retain(|_, n| *n > 0);
        out
    }

    /// Applies one event (asynchronously, in order per worker).
    pub fn apply(&self, event: RouterEvent) {
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
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&worker);
        }
    }

    /// Records that `worker` is about to cache `hashes` (the request just routed there).
    pub fn book(&self, worker: WorkerId, hashes: &[LocalBlockHash]) {
        let now = Instant::now();
        let expiry = now + PENDING_TTL;
        if let Ok(mut p) = self.pending.lock() {
            let blocks = p.entry(worker).or_default();
            if blocks.len() + hashes.len() > PENDING_MAX_PER_WORKER {
                blocks.retain(|_, exp| *exp > now);
            }
            for h in hashes {
                blocks.insert(h.0, expiry);
            }
        }
    }

    /// Forgets pending blocks of `worker` (the request failed before reaching the engine).
    pub fn unbook(&self, worker: WorkerId, hashes: &[LocalBlockHash]) {
        if let Ok(mut p) = self.pending.lock()
            && let Some(blocks) = p.get_mut(&worker)
        {
            for h in hashes {
                blocks.remove(&h.0);
            }
        }
    }

    /// Waits until every queued event is applied (tests, debug endpoints).
    pub async fn flush(&self) {
        let _ = self.tree.flush_and_wait().await;
    }

    /// Blocks the tree holds for `worker` matching `hashes`, ignoring pending entries.
    pub fn indexed_overlap(&self, worker: WorkerId, hashes: &[LocalBlockHash]) -> u32 {
        let scores = self.tree.backend().find_matches(hashes, false);
        scores.scores.get(&WorkerWithDpRank::new(worker, 0)).copied().unwrap_or(0)
    }
}
