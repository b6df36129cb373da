//! The coarse block scheme both ends of the link share.
//!
//! A spoke tells the hub which prompt prefixes its worker sets hold at a coarser grain than
//! the engines' blocks, so the hub can index every cluster's caches at a bounded bandwidth: one
//! coarse block stands for `factor` consecutive engine blocks (16 blocks of 16 tokens: 256
//! tokens). Its *local* hash folds the router's hashes of those engine blocks
//! (`dynamo-kv-router`'s token hashes, which do not depend on the engine's salt), and its
//! *chain* hash folds the local hash into its parent's chain hash, so it names the whole
//! prefix up to it.
//!
//! The spoke computes these from the engines' KV events, the hub from a prompt's tokens:
//! both must call these functions, which is why they live in the protocol crate.
//!
//! Invariant: a chain hash is never 0 (0 means "no parent", the root, on the wire).

/// Engine blocks per coarse block when the configuration does not say.
pub const DEFAULT_FACTOR: u32 = 16;

/// SplitMix64's finaliser: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Folds one more engine block's token hash into a coarse block's running hash (`acc` starts
/// at 0 for each coarse block). Order matters: the same blocks in another order fold apart.
pub fn fold(acc: u64, block: u64) -> u64 {
    mix(acc.rotate_left(23) ^ block ^ 0x9e37_79b9_7f4a_7c15)
}

/// The chain hash of a coarse block with local hash `local` after the block whose chain hash
/// is `parent` (0 for the first block of a prompt). Never 0.
pub fn chain(parent: u64, local: u64) -> u64 {
    match mix(parent.rotate_left(41) ^ mix(local ^ 0x2545_f491_4f6c_dd1d)) {
        0 => 1,
        h => h,
    }
}

/// The local hashes of the complete coarse blocks of a prompt whose engine blocks have the
/// token hashes `blocks` (a trailing part of fewer than `factor` blocks is left out, as the
/// spoke does not announce it either). `factor` 0 gives none.
pub fn local_hashes(blocks: &[u64], factor: u32) -> Vec<u64> {
    if factor == 0 {
        return Vec::new();
    }
    blocks.chunks_exact(factor as usize).map(|group| group.iter().fold(0, |acc, b| fold(acc, *b))).collect()
}

/// The coarse blocks of a prompt with these `local` hashes, first to last, each naming its
/// predecessor: what a spoke holding the whole prompt reports.
pub fn chained(local: &[u64]) -> Vec<crate::v1::CoarseBlock> {
    let mut parent = 0;
    local
        .iter()
        .map(|&local| {
            let hash = chain(parent, local);
            let block = crate::v1::CoarseBlock { hash, parent, local };
            parent = hash;
            block
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_hashes_group_whole_coarse_blocks_in_order() {
        let blocks: Vec<u64> = (1..=10).collect();
        let coarse = local_hashes(&blocks, 4);
        assert_eq!(coarse.len(), 2, "the trailing two blocks do not make a coarse block");
        assert_eq!(coarse[0], [1, 2, 3, 4].iter().fold(0, |a, b| fold(a, *b)));
        assert_ne!(coarse[0], [2, 1, 3, 4].iter().fold(0, |a, b| fold(a, *b)), "order matters");
        assert!(local_hashes(&blocks, 0).is_empty());
    }

    #[test]
    fn chains_name_the_whole_prefix() {
        let a = chain(0, 7);
        assert_ne!(chain(a, 8), chain(chain(0, 9), 8), "same block after another prefix");
        assert_ne!(a, 0);
        let blocks = chained(&[7, 8]);
        assert_eq!((blocks[0].hash, blocks[0].parent, blocks[1].parent), (a, 0, a));
        assert_eq!(blocks[1].hash, chain(a, 8));
    }
}
