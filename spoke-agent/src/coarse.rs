//! The coarse copy of one worker set's KV cache, which the spoke reports to the hub.
//!
//! Fed the same normalised events as the precise index ([`crate::index::KvIndex::apply`]),
//! it follows each worker's chains of engine blocks and re-blocks them into coarse blocks of
//! `factor` engine blocks (hashes from [`switchyard_proto::coarse`]). A coarse block is held by
//! the set while at least one worker holds the engine block that completed it; what changed
//! since the last report is collected in `dirty` and drained into a [`CoarseBlocks`] message,
//! so the hub's copy converges to the set's without sequence numbers: a new stream starts with
//! a reset and everything held.
//!
//! Invariants: per worker, a block is placed only after its parent (a block whose parent is
//! unknown is left out, with its descendants, exactly as the precise index leaves it out);
//! `refs` of a held block counts the workers' completing engine blocks that name it; the
//! stored blocks of one drain come parents first.

use std::sync::Mutex;

use dynamo_kv_router::protocols::{KvCacheEventData, RouterEvent, WorkerId};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use switchyard_proto::coarse::{chain, fold};
use switchyard_proto::v1::{CoarseBlock, CoarseBlocks};

/// Where a worker's chain stands after one engine block.
#[derive(Clone, Copy, Default)]
struct After {
    /// Chain hash of the last complete coarse block up to this engine block (0: none yet).
    prefix: u64,
    /// Folded token hashes of the engine blocks since that coarse block.
    acc: u64,
    /// Engine blocks folded into `acc`.
    pos: u32,
    /// Complete coarse blocks up to here.
    depth: u32,
    /// This engine block completed the coarse block `prefix`.
    completes: bool,
}

struct Held {
    parent: u64,
    local: u64,
    depth: u32,
    refs: u32,
}

#[derive(Default)]
struct State {
    workers: HashMap<WorkerId, HashMap<u64, After>>,
    held: HashMap<u64, Held>,
    dirty: HashSet<u64>,
    /// What the current stream's hub has been told is held.
    sent: HashSet<u64>,
    /// Engine blocks left out because their parent was unknown.
    orphans: u64,
}

/// The coarse copy of one worker set.
pub struct CoarseCopy {
    factor: u32,
    state: Mutex<State>,
}

impl std::fmt::Debug for CoarseCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoarseCopy").field("factor", &self.factor).finish()
    }
}

impl State {
    fn hold(&mut self, hash: u64, parent: u64, local: u64, depth: u32) {
        let h = self.held.entry(hash).or_insert(Held { parent, local, depth, refs: 0 });
        h.refs += 1;
        if h.refs == 1 {
            self.dirty.insert(hash);
        }
    }

    fn release(&mut self, hash: u64) {
        if let Some(h) = self.held.get_mut(&hash) {
            h.refs -= 1;
            if h.refs == 0 {
                self.held.remove(&hash);
                self.dirty.insert(hash);
            }
        }
    }

    fn drop_worker(&mut self, worker: WorkerId) {
        let Some(blocks) = self.workers.remove(&worker) else { return };
        for after in blocks.values().filter(|a| a.completes) {
            self.release(after.prefix);
        }
    }
}

impl CoarseCopy {
    /// An empty copy re-blocking `factor` engine blocks into one (0: keeps nothing).
    pub fn new(factor: u32) -> CoarseCopy {
        CoarseCopy { factor, state: Mutex::new(State::default()) }
    }

    /// Engine blocks per coarse block.
    pub fn factor(&self) -> u32 {
        self.factor
    }

    /// Follows one event of the precise index's stream.
    pub fn apply(&self, event: &RouterEvent) {
        if self.factor == 0 {
            return;
        }
        let Ok(mut st) = self.state.lock() else { return };
        let st = &mut *st;
        match &event.event.data {
            KvCacheEventData::Stored(stored) => {
                let chains = st.workers.entry(event.worker_id).or_default();
                let mut at = match stored.parent_hash {
                    None => After::default(),
                    Some(p) => match chains.get(&p.0) {
                        Some(a) => *a,
                        None => {
                            st.orphans += stored.blocks.len() as u64;
                            return;
                        }
                    },
                };
                let mut completed = Vec::new();
                for block in &stored.blocks {
                    // After a completing block `acc` and `pos` are 0: a new coarse block starts.
                    let acc = fold(at.acc, block.tokens_hash.0);
                    let pos = at.pos + 1;
                    at = if pos == self.factor {
                        let hash = chain(at.prefix, acc);
                        completed.push((hash, at.prefix, acc, at.depth + 1));
                        After { prefix: hash, acc: 0, pos: 0, depth: at.depth + 1, completes: true }
                    } else {
                        After { prefix: at.prefix, acc, pos, depth: at.depth, completes: false }
                    };
                    // An engine block stored again replaces what was known of it.
                    if let Some(old) = chains.insert(block.block_hash.0, at)
                        && old.completes
                    {
                        completed.push((old.prefix, 0, 0, u32::MAX));
                    }
                }
                for (hash, parent, local, depth) in completed {
                    if depth == u32::MAX {
                        st.release(hash);
                    } else {
                        st.hold(hash, parent, local, depth);
                    }
                }
            }
            KvCacheEventData::Removed(removed) => {
                let Some(chains) = st.workers.get_mut(&event.worker_id) else { return };
                let released: Vec<u64> = removed
                    .block_hashes
                    .iter()
                    .filter_map(|h| chains.remove(&h.0))
                    .filter(|a| a.completes)
                    .map(|a| a.prefix)
                    .collect();
                for hash in released {
                    st.release(hash);
                }
            }
            KvCacheEventData::Cleared => st.drop_worker(event.worker_id),
        }
    }

    /// Forgets everything `worker` held (resync, or the worker left).
    pub fn clear_worker(&self, worker: WorkerId) {
        if let Ok(mut st) = self.state.lock() {
            st.drop_worker(worker);
        }
    }

    /// Coarse blocks the set holds now.
    pub fn held(&self) -> usize {
        self.state.lock().map(|s| s.held.len()).unwrap_or(0)
    }

    /// Engine blocks left out so far because their parent was not known.
    pub fn orphans(&self) -> u64 {
        self.state.lock().map(|s| s.orphans).unwrap_or(0)
    }

    /// What changed since the last drain, at most `max` blocks of it (the rest waits for the
    /// next): `None` if nothing did. `reset` starts a new stream: the message then says
    /// reset, even if the set holds nothing, and lists what it holds.
    pub fn drain(&self, worker_set: &str, reset: bool, max: usize) -> Option<CoarseBlocks> {
        let Ok(mut st) = self.state.lock() else { return None };
        let st = &mut *st;
        if reset {
            st.sent.clear();
            st.dirty = st.held.keys().copied().collect();
        }
        if st.dirty.is_empty() && !reset {
            return None;
        }
        let take: Vec<u64> = if st.dirty.len() <= max {
            st.dirty.drain().collect()
        } else {
            // Shallowest first, so no report names a block before its parent.
            let mut all: Vec<(u32, u64)> =
                st.dirty.iter().map(|h| (st.held.get(h).map_or(0, |b| b.depth), *h)).collect();
            all.sort_unstable();
            all.truncate(max);
            for (_, h) in &all {
                st.dirty.remove(h);
            }
            all.into_iter().map(|(_, h)| h).collect()
        };
        let mut stored = Vec::new();
        let mut removed = Vec::new();
        for hash in take {
            match st.held.get(&hash) {
                Some(h) if st.sent.insert(hash) => {
                    stored.push((h.depth, CoarseBlock { hash, parent: h.parent, local: h.local }))
                }
                Some(_) => {}
                None => {
                    if st.sent.remove(&hash) {
                        removed.push(hash);
                    }
                }
            }
        }
        stored.sort_by_key(|(depth, _)| *depth);
        if stored.is_empty() && removed.is_empty() && !reset {
            return None;
        }
        Some(CoarseBlocks {
            worker_set: worker_set.to_owned(),
            reset,
            stored: stored.into_iter().map(|(_, b)| b).collect(),
            removed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_kv_router::protocols::{
        ExternalSequenceBlockHash, KvCacheEvent, KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData,
        LocalBlockHash,
    };
    use switchyard_proto::coarse::local_hashes;

    fn stored(worker: WorkerId, parent: Option<u64>, blocks: &[(u64, u64)]) -> RouterEvent {
        let blocks = blocks
            .iter()
            .map(|(engine, tokens)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(*engine),
                tokens_hash: LocalBlockHash(*tokens),
                mm_extra_info: None,
            })
            .collect();
        let data = KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent.map(ExternalSequenceBlockHash),
            start_position: None,
            blocks,
        });
        RouterEvent::new(worker, KvCacheEvent { event_id: 0, data, dp_rank: 0 })
    }

    fn removed(worker: WorkerId, engine: &[u64]) -> RouterEvent {
        let data = KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: engine.iter().map(|h| ExternalSequenceBlockHash(*h)).collect(),
        });
        RouterEvent::new(worker, KvCacheEvent { event_id: 0, data, dp_rank: 0 })
    }

    /// The chain hashes the hub computes for a prompt with these token hashes.
    fn hub_chain(tokens: &[u64], factor: u32) -> Vec<u64> {
        switchyard_proto::coarse::chained(&local_hashes(tokens, factor)).iter().map(|b| b.hash).collect()
    }

    #[test]
    fn chains_split_across_events_reblock_to_what_the_hub_computes() {
        let copy = CoarseCopy::new(4);
        let tokens: Vec<u64> = (100..110).collect();
        // Ten engine blocks in three events with parent links: two whole coarse blocks.
        copy.apply(&stored(1, None, &[(1, 100), (2, 101), (3, 102)]));
        copy.apply(&stored(1, Some(3), &[(4, 103), (5, 104), (6, 105)]));
        copy.apply(&stored(1, Some(6), &[(7, 106), (8, 107), (9, 108), (10, 109)]));
        let m = copy.drain("s", false, 100).expect("changes");
        let want = hub_chain(&tokens, 4);
        assert_eq!(m.stored.iter().map(|b| b.hash).collect::<Vec<_>>(), want, "parents first, same hashes");
        assert_eq!(m.stored[1].parent, want[0]);
        assert_eq!(m.stored[0].local, local_hashes(&tokens, 4)[0]);
        assert!(copy.drain("s", false, 100).is_none(), "nothing changed since");
    }

    #[test]
    fn a_block_stays_held_while_any_worker_holds_it() {
        let copy = CoarseCopy::new(2);
        copy.apply(&stored(1, None, &[(11, 5), (12, 6)]));
        copy.apply(&stored(2, None, &[(21, 5), (22, 6)]));
        let first = copy.drain("s", false, 100).expect("stored");
        assert_eq!(first.stored.len(), 1, "two workers, one coarse block");
        copy.apply(&removed(1, &[12]));
        assert!(copy.drain("s", false, 100).is_none(), "worker 2 still holds it");
        copy.clear_worker(2);
        let gone = copy.drain("s", false, 100).expect("removed");
        assert_eq!(gone.removed, vec![first.stored[0].hash]);
        assert_eq!(copy.held(), 0);
    }

    #[test]
    fn orphans_are_left_out_and_a_new_stream_gets_everything_in_bounded_reports() {
        let copy = CoarseCopy::new(1);
        copy.apply(&stored(1, Some(999), &[(1, 1)]));
        assert_eq!(copy.orphans(), 1);
        for i in 0..10u64 {
            copy.apply(&stored(1, if i == 0 { None } else { Some(i) }, &[(i + 1, i + 50)]));
        }
        let _ = copy.drain("s", false, 100);
        let first = copy.drain("s", true, 4).expect("a reset is always sent");
        assert!(first.reset);
        assert_eq!(first.stored.len(), 4);
        let mut total = first.stored.len();
        while let Some(m) = copy.drain("s", false, 4) {
            assert!(!m.reset);
            total += m.stored.len();
        }
        assert_eq!(total, 10);
        let empty = CoarseCopy::new(1);
        assert!(empty.drain("s", true, 4).is_some_and(|m| m.reset && m.stored.is_empty()));
    }
}
