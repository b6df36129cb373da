//! Properties of the KV-event batch decoder ([`decode_batch`]) on hostile input.
//!
//! The payload of a batch comes straight off a worker's socket, so the decoder must be total:
//! arbitrary bytes and arbitrary corruptions of valid batches give an error or a batch, never
//! a panic, and never memory out of proportion to the payload (msgpack length headers are
//! announcements, not allocations). Valid batches, encoded by the simulator's independent
//! vLLM-wire encoder in both of vLLM's event layouts, decode to exactly what was encoded.
//! The ZMTP [`FrameScanner`] in front of the socket is total too, and its verdict does not
//! depend on how the stream is split into reads.

use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEventData, compute_block_hash_for_seq,
};
use dynamo_kv_router::zmq_wire::ZmqEventNormalizer;
use proptest::prelude::*;
use switchyard_sim::engine::KvEvent;
use switchyard_sim::wire::{WireFormat, encode_batch};
use switchyard_spoke::kv_subscriber::{DecodedBatch, FrameScanner, decode_batch};

const BLOCK: u32 = 16;
const WORKER: u64 = 42;

/// msgpack headers announcing 2^32 - 1 elements or bytes: array32, map32, str32, bin32.
const HUGE_HEADERS: [[u8; 5]; 4] = [
    [0xdd, 0xff, 0xff, 0xff, 0xff],
    [0xdf, 0xff, 0xff, 0xff, 0xff],
    [0xdb, 0xff, 0xff, 0xff, 0xff],
    [0xc6, 0xff, 0xff, 0xff, 0xff],
];

fn decode(payload: &[u8]) -> (Option<DecodedBatch>, u64) {
    let mut normalizer = ZmqEventNormalizer::new(BLOCK);
    let mut last_event_id = 0;
    let batch = decode_batch(&mut normalizer, WORKER, &mut last_event_id, payload).ok();
    (batch, last_event_id)
}

/// Peak resident memory of this process so far (Linux), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Events as the engine would announce them: store events with distinct hashes (the
/// normaliser drops self-referencing chains) and whole blocks of tokens.
fn event() -> impl Strategy<Value = KvEvent> {
    prop_oneof![
        4 => (proptest::collection::btree_set(any::<u64>(), 1..6), any::<bool>(), any::<u32>()).prop_map(
            |(hashes, has_parent, seed)| {
                let mut hashes: Vec<u64> = hashes.into_iter().collect();
                let parent = if has_parent { hashes.pop() } else { None };
                let hashes = if hashes.is_empty() { vec![seed as u64] } else { hashes };
                let tokens = (0..hashes.len() as u32 * BLOCK).map(|i| seed.wrapping_add(i.wrapping_mul(7919))).collect();
                KvEvent::BlockStored {
                    block_hashes: hashes,
                    parent_block_hash: parent.filter(|p| *p != seed as u64),
                    token_ids: tokens,
                    block_size: BLOCK,
                }
            }
        ),
        2 => proptest::collection::vec(any::<u64>(), 0..6).prop_map(|block_hashes| KvEvent::BlockRemoved { block_hashes }),
        1 => Just(KvEvent::AllBlocksCleared),
    ]
}

fn format() -> impl Strategy<Value = WireFormat> {
    prop_oneof![Just(WireFormat::Current), Just(WireFormat::Legacy)]
}

fn valid_batch() -> impl Strategy<Value = (Vec<KvEvent>, u32, WireFormat, Vec<u8>)> {
    (proptest::collection::vec(event(), 0..8), 0u32..4, format(), -1e9f64..1e9).prop_map(
        |(events, dp_rank, format, ts)| {
            let payload = encode_batch(ts, &events, dp_rank, format);
            (events, dp_rank, format, payload)
        },
    )
}

/// One corruption of a payload.
#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        mask: u8,
    },
    Set {
        at: usize,
        byte: u8,
    },
    Truncate {
        at: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Remove {
        at: usize,
        len: usize,
    },
    /// Overwrite with a header announcing a huge length.
    Huge {
        at: usize,
        which: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<prop::sample::Index>();
    prop_oneof![
        (at.clone(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at: at.index(usize::MAX), mask }),
        (at.clone(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at: at.index(usize::MAX), byte }),
        at.clone().prop_map(|at| Mutation::Truncate { at: at.index(usize::MAX) }),
        (at.clone(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Insert { at: at.index(usize::MAX), bytes }),
        (at.clone(), 1usize..16).prop_map(|(at, len)| Mutation::Remove { at: at.index(usize::MAX), len }),
        (at, 0usize..HUGE_HEADERS.len()).prop_map(|(at, which)| Mutation::Huge { at: at.index(usize::MAX), which }),
    ]
}

fn apply(payload: &mut Vec<u8>, m: &Mutation) {
    if payload.is_empty() {
        return;
    }
    let n = payload.len();
    match m {
        Mutation::Flip { at, mask } => payload[at % n] ^= mask,
        Mutation::Set { at, byte } => payload[at % n] = *byte,
        Mutation::Truncate { at } => payload.truncate(at % n),
        Mutation::Insert { at, bytes } => {
            let at = at % (n + 1);
            payload.splice(at..at, bytes.iter().copied());
        }
        Mutation::Remove { at, len } => {
            let at = at % n;
            payload.drain(at..(at + len).min(n));
        }
        Mutation::Huge { at, which } => {
            let at = at % n;
            let header = HUGE_HEADERS[*which];
            let end = (at + header.len()).min(n);
            payload.splice(at..end, header);
        }
    }
}

fn hashes(v: &[u64]) -> Vec<ExternalSequenceBlockHash> {
    v.iter().map(|h| ExternalSequenceBlockHash(*h)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..512)) {
        let (batch, ids) = decode(&payload);
        if let Some(b) = batch {
            prop_assert_eq!(ids, b.raw_events as u64);
            prop_assert!(b.events.len() <= b.raw_events);
        }
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_prefix_never_panic(
        (_, _, _, valid) in valid_batch(),
        tail in proptest::collection::vec(any::<u8>(), 0..64),
        keep in any::<prop::sample::Index>(),
    ) {
        let mut payload = valid[..keep.index(valid.len() + 1)].to_vec();
        payload.extend(tail);
        let _ = decode(&payload);
    }

    #[test]
    fn mutated_valid_batches_never_panic(
        (_, _, _, valid) in valid_batch(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let mut payload = valid;
        for m in &mutations {
            apply(&mut payload, m);
        }
        let (batch, ids) = decode(&payload);
        if let Some(b) = batch {
            // Whatever decodes, decodes consistently.
            prop_assert_eq!(ids, b.raw_events as u64);
            prop_assert!(b.events.len() <= b.raw_events);
        }
    }

    #[test]
    fn frame_scanner_verdict_is_independent_of_read_splits(
        stream in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        cap in 0u64..4096,
    ) {
        let mut whole = FrameScanner::new(cap);
        let verdict = whole.feed(&stream);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        cuts.sort_unstable();
        let mut split = FrameScanner::new(cap);
        let mut start = 0;
        let mut first_err = None;
        for end in cuts.into_iter().chain([stream.len()]) {
            if let Err(e) = split.feed(&stream[start..end]) {
                first_err.get_or_insert(e);
            }
            start = end;
        }
        prop_assert_eq!(verdict, first_err.map_or(Ok(()), Err));
    }

    #[test]
    fn valid_batches_round_trip((events, dp_rank, _format, payload) in valid_batch()) {
        let (batch, ids) = decode(&payload);
        let batch = batch.expect("a valid batch decodes");
        prop_assert_eq!(batch.raw_events, events.len());
        prop_assert_eq!(ids, events.len() as u64);
        // Every event here is a local GPU event the normaliser keeps.
        prop_assert_eq!(batch.events.len(), events.len());
        for (i, (want, got)) in events.iter().zip(&batch.events).enumerate() {
            prop_assert_eq!(got.worker_id, WORKER);
            prop_assert_eq!(got.event.event_id, i as u64 + 1);
            prop_assert_eq!(got.event.dp_rank, dp_rank);
            match (want, &got.event.data) {
                (
                    KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, .. },
                    KvCacheEventData::Stored(s),
                ) => {
                    prop_assert_eq!(s.parent_hash, parent_block_hash.map(ExternalSequenceBlockHash));
                    let got_hashes: Vec<_> = s.blocks.iter().map(|b| b.block_hash).collect();
                    prop_assert_eq!(got_hashes, hashes(block_hashes));
                    let tokens: Vec<_> = s.blocks.iter().map(|b| b.tokens_hash).collect();
                    prop_assert_eq!(tokens, compute_block_hash_for_seq(token_ids, BLOCK, BlockHashOptions::default()));
                }
                (KvEvent::BlockRemoved { block_hashes }, KvCacheEventData::Removed(r)) => {
                    prop_assert_eq!(&r.block_hashes, &hashes(block_hashes));
                }
                (KvEvent::AllBlocksCleared, KvCacheEventData::Cleared) => {}
                (want, got) => prop_assert!(false, "event {i}: encoded {want:?}, decoded {got:?}"),
            }
        }
    }
}

/// Every container and string header of a valid batch, in turn, announces 2^32 - 1 items:
/// the decoder must fail (the bytes are not there) without reserving what was announced.
#[test]
fn huge_length_headers_are_not_preallocated() {
    let events = vec![
        KvEvent::BlockStored {
            block_hashes: vec![1, 2, 3],
            parent_block_hash: Some(9),
            token_ids: (0..48).collect(),
            block_size: BLOCK,
        },
        KvEvent::BlockRemoved { block_hashes: vec![4, 5] },
        KvEvent::AllBlocksCleared,
    ];
    let before = peak_rss();
    let mut tried = 0;
    for format in [WireFormat::Current, WireFormat::Legacy] {
        let valid = encode_batch(1.5, &events, 1, format);
        assert!(decode(&valid).0.is_some(), "the unmodified batch decodes");
        for at in 0..valid.len() {
            for header in HUGE_HEADERS {
                let mut payload = valid.clone();
                payload.splice(at..(at + header.len()).min(valid.len()), header);
                let _ = decode(&payload);
                // Nested: a chain of huge headers, each inside the previous one.
                let mut nested = valid[..at].to_vec();
                for _ in 0..200 {
                    nested.extend(header);
                }
                let _ = decode(&nested);
                tried += 2;
            }
        }
    }
    assert!(tried > 1000);
    if let (Some(before), Some(after)) = (before, peak_rss()) {
        // One honoured 2^32-element header would be gigabytes; serde caps pre-allocation at
        // 1 MiB per container, and those are freed as each decode fails.
        assert!(after < before + (128 << 20), "peak rss grew from {before} to {after}");
    }
}
