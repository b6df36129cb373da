//! A paged KV cache with prefix caching, as vLLM's V1 block pool does it.
//!
//! Invariants:
//! * every block is either in use (`ref_cnt > 0`) or on the free list, never both;
//! * a block with a hash is reachable from `cached` under that hash, and at most one block is
//!   registered per hash;
//! * the free list is LRU: blocks freed earlier are reused first, and blocks freed together are
//!   freed tail-first so a sequence's last blocks are evicted before its first ones;
//! * reusing a free block that still has a hash evicts it: the hash is unregistered and the
//!   caller receives it to publish a `BlockRemoved` event.

use std::collections::{BTreeMap, HashMap};

/// Index of a block in the pool.
pub type BlockId = u32;

#[derive(Debug, Clone, Copy, Default)]
struct Block {
    ref_cnt: u32,
    /// Engine block hash, when the block is full and registered in the prefix cache.
    hash: Option<u64>,
    /// Position in the free list, when free.
    free_stamp: Option<u64>,
}

/// The block pool of one engine.
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<Block>,
    /// Free blocks by free stamp: the smallest stamp is the least recently freed.
    free: BTreeMap<u64, BlockId>,
    next_stamp: u64,
    cached: HashMap<u64, BlockId>,
    used: u32,
}

impl BlockPool {
    /// A pool of `num_blocks` empty blocks.
    pub fn new(num_blocks: u32) -> BlockPool {
        let mut pool = BlockPool {
            blocks: vec![Block::default(); num_blocks as usize],
            free: BTreeMap::new(),
            next_stamp: 0,
            cached: HashMap::new(),
            used: 0,
        };
        for id in 0..num_blocks {
            pool.push_free(id);
        }
        pool
    }

    fn push_free(&mut self, id: BlockId) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.blocks[id as usize].free_stamp = Some(stamp);
        self.free.insert(stamp, id);
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Blocks that can be allocated right now (free, cached or not).
    pub fn num_free(&self) -> u32 {
        self.free.len() as u32
    }

    /// Fraction of blocks in use, 0..=1 (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() { 0.0 } else { f64::from(self.used) / self.blocks.len() as f64 }
    }

    /// Whether block `id` is on the free list.
    pub fn is_free(&self, id: BlockId) -> bool {
        self.blocks[id as usize].free_stamp.is_some()
    }

    /// The block registered under `hash`, if any.
    pub fn lookup(&self, hash: u64) -> Option<BlockId> {
        self.cached.get(&hash).copied()
    }

    /// Takes a reference on a cached block found by [`BlockPool::lookup`] (a prefix hit).
    pub fn touch(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        if let Some(stamp) = b.free_stamp.take() {
            self.free.remove(&stamp);
        }
        if b.ref_cnt == 0 {
            self.used += 1;
        }
        b.ref_cnt += 1;
    }

    /// Allocates `n` blocks, evicting least recently freed cached blocks as needed. Returns
    /// `None` (and changes nothing) when fewer than `n` blocks are free. Evicted hashes are
    /// appended to `evicted`.
    pub fn allocate(&mut self, n: u32, evicted: &mut Vec<u64>) -> Option<Vec<BlockId>> {
        if n > self.num_free() {
            return None;
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let (_, id) = self.free.pop_first()?;
            let b = &mut self.blocks[id as usize];
            b.free_stamp = None;
            b.ref_cnt = 1;
            if let Some(h) = b.hash.take() {
                self.cached.remove(&h);
                evicted.push(h);
            }
            self.used += 1;
            out.push(id);
        }
        Some(out)
    }

    /// Registers a full block under `hash`. Returns false (and registers nothing) when another
    /// block already holds that hash, as when two requests prefill the same prefix at once.
    pub fn register(&mut self, id: BlockId, hash: u64) -> bool {
        if self.cached.contains_key(&hash) || self.blocks[id as usize].hash.is_some() {
            return false;
        }
        self.blocks[id as usize].hash = Some(hash);
        self.cached.insert(hash, id);
        true
    }

    /// Drops one reference on each block, tail first; blocks reaching zero go to the free list
    /// (keeping their hash, so they can still be hit until evicted).
    pub fn free(&mut self, ids: &[BlockId]) {
        for &id in ids.iter().rev() {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.ref_cnt > 0, "double free of block {id}");
            b.ref_cnt = b.ref_cnt.saturating_sub(1);
            if b.ref_cnt == 0 {
                self.used -= 1;
                self.push_free(id);
            }
        }
    }

    /// Forgets every cached hash (vLLM `reset_prefix_cache`). Blocks in use stay allocated.
    pub fn clear_cache(&mut self) {
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.cached.clear();
    }

    /// Number of registered (cached) blocks.
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_eviction_reports_hashes_and_keeps_invariants() {
        let mut p = BlockPool::new(4);
        let mut ev = Vec::new();
        let a = p.allocate(2, &mut ev).expect("2 free");
        assert!(p.register(a[0], 10) && p.register(a[1], 11));
        assert!(!p.register(a[1], 12), "a block holds one hash");
        p.free(&a); // tail first: 11 then 10 become free, 11 older
        let b = p.allocate(2, &mut ev).expect("2 free");
        assert!(ev.is_empty(), "never-used blocks go first");
        assert_eq!(p.usage(), 0.5);
        let c = p.allocate(1, &mut ev).expect("1 free");
        assert_eq!(ev, vec![11], "the tail block of the freed sequence is evicted first");
        assert_eq!(c, vec![a[1]]);
        assert_eq!(p.lookup(10), Some(a[0]));
        p.touch(a[0]);
        assert!(p.allocate(1, &mut ev).is_none(), "pool exhausted");
        assert_eq!(p.usage(), 1.0);
        p.free(&b);
        p.free(&c);
        p.free(&[a[0]]);
        assert_eq!(p.num_free(), 4);
        p.clear_cache();
        assert_eq!(p.num_cached(), 0);
    }
}
