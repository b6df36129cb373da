//! The cross-cluster prefix index: which cluster's worker set holds which prompt prefix.
//!
//! Built from the spokes' coarse reports (`CoarseReport`, hashes from
//! [`switchyard_proto::coarse`]) in the same `dynamo-kv-router` radix tree a spoke indexes its
//! engines with; here each (cluster, worker set) pair is one of the tree's "workers". A
//! lookup walks the tree once with a prompt's coarse local hashes and gives, per pair, how many
//! leading coarse blocks it holds.
//!
//! Invariants: writes go through the indexer's own thread, in the order the reports arrived
//! (per cluster, the order of its stream), and a report's counts change only once the tree
//! holds it; reads are inline and never wait for writes. A set's
//! first report on a stream resets what the hub held for it, so a reconnecting spoke's copy
//! replaces the old one whole. A cluster that is not live keeps its entries (it is not a
//! candidate, so they are never read) until its next stream resets them.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use dynamo_kv_router::indexer::SyncIndexer;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent, WorkerId,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, ThreadPoolIndexer};
use switchyard_proto::v1::{CoarseBlocks, CoarseReport};

use crate::batch::SetOfCluster;

#[derive(Default)]
struct Ids {
    by_pair: HashMap<SetOfCluster, WorkerId>,
    pairs: Vec<SetOfCluster>,
    /// Coarse blocks held per pair, as its reports counted them.
    held: Vec<i64>,
}

/// The hub's index of every live cluster's coarse caches.
pub struct PrefixIndex {
    tree: ThreadPoolIndexer<ConcurrentRadixTreeCompressed>,
    ids: RwLock<Ids>,
    event_id: AtomicU64,
}

impl std::fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixIndex").finish_non_exhaustive()
    }
}

impl Default for PrefixIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> PrefixIndex {
        PrefixIndex {
            // The block size only matters for hashing tokens, which the hub does itself.
            tree: ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, 1),
            ids: RwLock::new(Ids::default()),
            event_id: AtomicU64::new(0),
        }
    }

    fn id(&self, pair: &SetOfCluster) -> WorkerId {
        if let Ok(ids) = self.ids.read()
            && let Some(id) = ids.by_pair.get(pair)
        {
            return *id;
        }
        let Ok(mut ids) = self.ids.write() else { return WorkerId::MAX };
        if let Some(id) = ids.by_pair.get(pair) {
            return *id;
        }
        let id = ids.pairs.len() as WorkerId;
        ids.by_pair.insert(pair.clone(), id);
        ids.pairs.push(pair.clone());
        ids.held.push(0);
        id
    }

    fn count(&self, id: WorkerId, delta: i64, reset: bool) {
        if let Ok(mut ids) = self.ids.write()
            && let Some(n) = ids.held.get_mut(id as usize)
        {
            *n = if reset { delta } else { (*n + delta).max(0) };
        }
    }

    fn enqueue(&self, worker: WorkerId, data: KvCacheEventData) {
        let event_id = self.event_id.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.tree.enqueue_event(RouterEvent::new(worker, KvCacheEvent { event_id, data, dp_rank: 0 })) {
            tracing::warn!(error = %e, "prefix index dropped an event");
        }
    }

    /// Applies one coarse report of `cluster` and returns once the tree holds it, so what
    /// [`PrefixIndex::held`] shows is what a lookup finds.
    pub async fn apply(&self, cluster: &str, report: &CoarseReport) {
        let counts: Vec<(WorkerId, i64, bool)> =
            report.worker_sets.iter().map(|set| self.enqueue_set(cluster, set)).collect();
        self.flush().await;
        for (id, delta, reset) in counts {
            self.count(id, delta, reset);
        }
    }

    /// Enqueues one set's changes; returns its id and the change of its count.
    fn enqueue_set(&self, cluster: &str, set: &CoarseBlocks) -> (WorkerId, i64, bool) {
        let id = self.id(&(cluster.to_owned(), set.worker_set.clone()));
        if set.reset {
            self.enqueue(id, KvCacheEventData::Cleared);
        }
        // Consecutive blocks of one chain go in one event: each names its predecessor.
        let mut i = 0;
        while i < set.stored.len() {
            let parent = set.stored[i].parent;
            let mut blocks = Vec::new();
            let mut last = None;
            while i < set.stored.len() && last.is_none_or(|h| set.stored[i].parent == h) {
                let b = &set.stored[i];
                blocks.push(KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(b.hash),
                    tokens_hash: LocalBlockHash(b.local),
                    mm_extra_info: None,
                });
                last = Some(b.hash);
                i += 1;
            }
            let parent_hash = (parent != 0).then_some(ExternalSequenceBlockHash(parent));
            self.enqueue(id, KvCacheEventData::Stored(KvCacheStoreData { parent_hash, start_position: None, blocks }));
        }
        if !set.removed.is_empty() {
            let block_hashes = set.removed.iter().map(|h| ExternalSequenceBlockHash(*h)).collect();
            self.enqueue(id, KvCacheEventData::Removed(KvCacheRemoveData { block_hashes }));
        }
        (id, set.stored.len() as i64 - set.removed.len() as i64, set.reset)
    }

    /// Leading coarse blocks of a prompt (its coarse local hashes, `local`) each pair holds;
    /// pairs with none are left out.
    pub fn lookup(&self, local: &[u64]) -> HashMap<SetOfCluster, u32> {
        if local.is_empty() {
            return HashMap::new();
        }
        let hashes: Vec<LocalBlockHash> = local.iter().map(|h| LocalBlockHash(*h)).collect();
        let scores = self.tree.backend().find_matches(&hashes, false);
        let Ok(ids) = self.ids.read() else { return HashMap::new() };
        scores
            .scores
            .iter()
            .filter(|(_, n)| **n > 0)
            .filter_map(|(w, n)| Some((ids.pairs.get(w.worker_id as usize)?.clone(), *n)))
            .collect()
    }

    /// Coarse blocks each pair holds, as its reports counted them (status page).
    pub fn held(&self) -> Vec<(SetOfCluster, u64)> {
        let Ok(ids) = self.ids.read() else { return Vec::new() };
        ids.pairs.iter().cloned().zip(ids.held.iter().map(|n| (*n).max(0) as u64)).collect()
    }

    /// Waits until every event enqueued so far is in the tree.
    async fn flush(&self) {
        let _ = self.tree.flush_and_wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::coarse::{chained, local_hashes};
    use switchyard_proto::v1::CoarseBlock;

    /// The coarse blocks of a prompt with these engine-block hashes, as a spoke reports them.
    fn blocks(engine: &[u64], factor: u32) -> Vec<CoarseBlock> {
        chained(&local_hashes(engine, factor))
    }

    fn report(set: &str, reset: bool, stored: Vec<CoarseBlock>, removed: Vec<u64>) -> CoarseReport {
        CoarseReport { worker_sets: vec![CoarseBlocks { worker_set: set.into(), reset, stored, removed }] }
    }

    #[tokio::test]
    async fn the_cluster_holding_the_longer_prefix_scores_higher_and_a_reset_replaces_a_copy() {
        let index = PrefixIndex::new();
        let prompt: Vec<u64> = (1..=64).collect();
        let chain4 = blocks(&prompt, 16);
        assert_eq!(chain4.len(), 4);
        index.apply("east", &report("a", true, chain4.clone(), vec![])).await;
        index.apply("west", &report("a", true, chain4[..1].to_vec(), vec![])).await;
        let q = local_hashes(&prompt, 16);
        let got = index.lookup(&q);
        assert_eq!(got.get(&("east".into(), "a".into())), Some(&4));
        assert_eq!(got.get(&("west".into(), "a".into())), Some(&1));
        // Another prompt sharing only the first block.
        let mut other = prompt.clone();
        other[20] = 999;
        assert_eq!(index.lookup(&local_hashes(&other, 16)).get(&("east".into(), "a".into())), Some(&1));

        // East evicts its tail; then reconnects with an empty cache.
        index.apply("east", &report("a", false, vec![], vec![chain4[3].hash, chain4[2].hash])).await;
        assert_eq!(index.lookup(&q).get(&("east".into(), "a".into())), Some(&2));
        index.apply("east", &report("a", true, vec![], vec![])).await;
        assert!(!index.lookup(&q).contains_key(&("east".into(), "a".into())));
        let held: HashMap<_, _> = index.held().into_iter().collect();
        assert_eq!(held[&("east".to_string(), "a".to_string())], 0);
        assert_eq!(held[&("west".to_string(), "a".to_string())], 1);
    }
}
