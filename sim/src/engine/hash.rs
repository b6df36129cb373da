//! Block hashes of the simulated prefix cache.
//!
//! Two algorithms, named as vLLM's `--prefix-caching-hash-algo` values:
//!
//! - `sha256` (default): vLLM's default hashes pickled Python tuples, which cannot be
//!   reproduced outside Python; the simulator stands in with a fast salted 64-bit chain hash
//!   that, like the real one, means nothing to anyone but its engine.
//! - `sha256_cbor`: exactly vLLM's. A block's digest is SHA-256 over the canonical CBOR of
//!   `(parent digest, tuple(token ids), extra keys = None)`, the first block's parent being
//!   `NONE_HASH` = SHA-256 over the CBOR text of the seed (`PYTHONHASHSEED` when set, else
//!   vLLM's fixed default seed). Events carry the digest's low 64 bits, big-endian, as vLLM's
//!   integer block hashes do. The differential test compares these values with real vLLM's.
//!
//! Invariant: a chain is carried as a [`Link`], so the digest algorithm gets the full parent
//! digest while the pool and the events keep 64-bit hashes.

use sha2::{Digest, Sha256};

/// vLLM's seed for `NONE_HASH` when `PYTHONHASHSEED` is unset.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// Which hash the engine computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashAlgo {
    /// The simulator's own chain hash, salted per engine.
    #[default]
    Sha256,
    /// vLLM's `sha256_cbor`, bit for bit.
    Sha256Cbor,
}

impl HashAlgo {
    /// The name vLLM uses (`cache_config_info`, the command-line flag).
    pub fn as_str(self) -> &'static str {
        match self {
            HashAlgo::Sha256 => "sha256",
            HashAlgo::Sha256Cbor => "sha256_cbor",
        }
    }
}

/// The state carried from one block of a chain to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Link {
    /// Before the first block.
    #[default]
    Start,
    /// After a block of the salted hash.
    Salted(u64),
    /// After a block of `sha256_cbor`: its full digest.
    Digest([u8; 32]),
}

/// A configured block hasher.
#[derive(Debug, Clone, Copy)]
pub enum Hasher {
    /// The salted chain hash.
    Salted(u64),
    /// `sha256_cbor` with its `NONE_HASH`.
    Sha256Cbor([u8; 32]),
}

impl Hasher {
    /// A hasher for `algo`: `salt` for the salted hash, `seed` for `NONE_HASH`.
    pub fn new(algo: HashAlgo, salt: u64, seed: &str) -> Hasher {
        match algo {
            HashAlgo::Sha256 => Hasher::Salted(salt),
            HashAlgo::Sha256Cbor => {
                let mut cbor = Vec::with_capacity(seed.len() + 9);
                head(&mut cbor, 3, seed.len() as u64);
                cbor.extend_from_slice(seed.as_bytes());
                Hasher::Sha256Cbor(Sha256::digest(&cbor).into())
            }
        }
    }

    /// The hash of the block after `prev` holding `tokens`, and the link to the next block.
    pub fn next(&self, prev: Link, tokens: &[u32]) -> (u64, Link) {
        match *self {
            Hasher::Salted(salt) => {
                let parent = match prev {
                    Link::Salted(p) => Some(p),
                    _ => None,
                };
                let mut h = super::mix(salt ^ parent.map_or(0x5bd1_e995, |p| p.rotate_left(17)));
                for &t in tokens {
                    h = super::mix(h ^ u64::from(t));
                }
                (h, Link::Salted(h))
            }
            Hasher::Sha256Cbor(none_hash) => {
                let parent = match prev {
                    Link::Digest(d) => d,
                    _ => none_hash,
                };
                let mut cbor = Vec::with_capacity(40 + tokens.len() * 3);
                head(&mut cbor, 4, 3);
                head(&mut cbor, 2, 32);
                cbor.extend_from_slice(&parent);
                head(&mut cbor, 4, tokens.len() as u64);
                for &t in tokens {
                    head(&mut cbor, 0, u64::from(t));
                }
                cbor.push(0xf6); // None
                let digest: [u8; 32] = Sha256::digest(&cbor).into();
                let mut low = [0u8; 8];
                low.copy_from_slice(&digest[24..]);
                (u64::from_be_bytes(low), Link::Digest(digest))
            }
        }
    }
}

/// A CBOR item head in its shortest form (canonical CBOR).
fn head(out: &mut Vec<u8>, major: u8, value: u64) {
    let m = major << 5;
    match value {
        0..=23 => out.push(m | value as u8),
        24..=0xff => out.extend([m | 24, value as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend((value as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend((value as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend(value.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reference values from vLLM 0.32.0 itself (`init_none_hash(sha256_cbor)` with
    /// PYTHONHASHSEED=0, then `hash_block_tokens` and `maybe_convert_block_hash`).
    #[test]
    fn sha256_cbor_matches_vllm() {
        let hasher = Hasher::new(HashAlgo::Sha256Cbor, 0, "0");
        let Hasher::Sha256Cbor(none) = hasher else { unreachable!("cbor hasher") };
        assert_eq!(hex(&none), "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
        let first: Vec<u32> = (0..32).collect();
        let (h1, link) = hasher.next(Link::Start, &first);
        assert_eq!(link, Link::Digest(digest("180320f9c38a50f63f2dd45a39a4a15fed98db85e4d1fea5e8fcef66cbbf241a")));
        assert_eq!(h1, 16_788_556_735_714_370_586);
        let second: Vec<u32> = (1000..1032).collect();
        let (h2, _) = hasher.next(link, &second);
        assert_eq!(h2, 2_038_633_873_384_841_267);
    }

    #[test]
    fn canonical_heads() {
        let mut out = Vec::new();
        for v in [0, 23, 24, 300, 70_000, 1 << 40] {
            head(&mut out, 0, v);
        }
        assert_eq!(hex(&out), "001718181901 2c1a000111701b0000010000000000".replace(' ', ""));
    }

    fn digest(s: &str) -> [u8; 32] {
        let mut d = [0u8; 32];
        for (i, b) in d.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex");
        }
        d
    }
}
