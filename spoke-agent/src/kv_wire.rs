//! A direct decoder for the KV-event batches vLLM publishes for text models.
//!
//! `dynamo-kv-router`'s general decoder reads block hashes and token ids through serde's
//! untagged enums, which buffer every element as a self-describing value before deciding
//! what it is; on scheduler-step batches that was about half of the ingest's time. This
//! module reads the msgpack bytes in one pass for the shapes vLLM emits — a batch
//! `[ts, [event, ...], dp_rank]` of tagged maps `BlockStored` / `BlockRemoved` /
//! `AllBlocksCleared` with plain values — and builds the same [`RawKvEvent`]s.
//!
//! Invariant: [`decode`] returns `Some` only for bytes it understands completely, and then
//! exactly what [`dynamo_kv_router::zmq_wire::decode_event_batch`] returns for them (the
//! tests compare the two on every shape the simulator and vLLM emit and on random
//! variations). Anything else — legacy array-form events, multimodal or salted extra keys,
//! EAGLE bigram token ids, locality or ownership fields, unknown keys, kinds or markers,
//! trailing bytes, malformed input — returns `None`, and the caller uses the general
//! decoder, which also produces its errors and warnings. Never panics.

use dynamo_kv_router::zmq_wire::{BlockHashValue, KvCacheSpecKind, KvEventBatch, RawKvEvent};

/// The batch in `payload`, or `None` when it is not in the shapes this decoder reads.
pub fn decode(payload: &[u8]) -> Option<KvEventBatch> {
    let mut r = Reader { buf: payload, pos: 0 };
    if r.array_len()? != 3 {
        return None;
    }
    let ts = r.f64()?;
    let n = r.array_len()?;
    // Each event takes at least one byte: a hostile length cannot make us pre-allocate.
    let mut events = Vec::with_capacity(n.min(payload.len()));
    for _ in 0..n {
        events.push(r.event()?);
    }
    let data_parallel_rank = if r.nil() {
        None
    } else {
        match r.int()? {
            Int::Signed(v) => Some(i32::try_from(v).ok()?),
            Int::Unsigned(_) => return None,
        }
    };
    (r.pos == payload.len()).then_some(KvEventBatch { ts, events, data_parallel_rank })
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// A msgpack integer, keeping whether it was encoded unsigned beyond `i64`.
enum Int {
    Signed(i64),
    Unsigned(u64),
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn be(&mut self, n: usize) -> Option<u64> {
        Some(self.take(n)?.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn nil(&mut self) -> bool {
        if self.peek() == Some(0xc0) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn array_len(&mut self) -> Option<usize> {
        match self.byte()? {
            b @ 0x90..=0x9f => Some(usize::from(b & 0x0f)),
            0xdc => Some(self.be(2)? as usize),
            0xdd => Some(self.be(4)? as usize),
            _ => None,
        }
    }

    fn map_len(&mut self) -> Option<usize> {
        match self.byte()? {
            b @ 0x80..=0x8f => Some(usize::from(b & 0x0f)),
            0xde => Some(self.be(2)? as usize),
            0xdf => Some(self.be(4)? as usize),
            _ => None,
        }
    }

    fn str(&mut self) -> Option<&str> {
        let n = match self.byte()? {
            b @ 0xa0..=0xbf => usize::from(b & 0x1f),
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            _ => return None,
        };
        std::str::from_utf8(self.take(n)?).ok()
    }

    fn opt_string(&mut self) -> Option<Option<String>> {
        if self.nil() { Some(None) } else { Some(Some(self.str()?.to_owned())) }
    }

    fn int(&mut self) -> Option<Int> {
        let b = self.byte()?;
        Some(match b {
            0x00..=0x7f => Int::Signed(i64::from(b)),
            0xe0..=0xff => Int::Signed(i64::from(b as i8)),
            0xcc => Int::Signed(self.be(1)? as i64),
            0xcd => Int::Signed(self.be(2)? as i64),
            0xce => Int::Signed(self.be(4)? as i64),
            0xcf => {
                let v = self.be(8)?;
                i64::try_from(v).map_or(Int::Unsigned(v), Int::Signed)
            }
            0xd0 => Int::Signed(i64::from(self.be(1)? as u8 as i8)),
            0xd1 => Int::Signed(i64::from(self.be(2)? as u16 as i16)),
            0xd2 => Int::Signed(i64::from(self.be(4)? as u32 as i32)),
            0xd3 => Int::Signed(self.be(8)? as i64),
            _ => return None,
        })
    }

    fn uint(&mut self) -> Option<u64> {
        match self.int()? {
            Int::Signed(v) => u64::try_from(v).ok(),
            Int::Unsigned(v) => Some(v),
        }
    }

    fn f64(&mut self) -> Option<f64> {
        match self.byte()? {
            0xcb => Some(f64::from_bits(self.be(8)?)),
            0xca => Some(f64::from(f32::from_bits(self.be(4)? as u32))),
            _ => None,
        }
    }

    fn hash(&mut self) -> Option<BlockHashValue> {
        // As the untagged `BlockHashValue`: signed whenever the value fits an i64.
        Some(match self.int()? {
            Int::Signed(v) => BlockHashValue::Signed(v),
            Int::Unsigned(v) => BlockHashValue::Unsigned(v),
        })
    }

    fn hashes(&mut self) -> Option<Vec<BlockHashValue>> {
        let n = self.array_len()?;
        let mut out = Vec::with_capacity(n.min(self.buf.len()));
        for _ in 0..n {
            out.push(self.hash()?);
        }
        Some(out)
    }

    fn opt_u32(&mut self) -> Option<Option<u32>> {
        if self.nil() { Some(None) } else { Some(Some(u32::try_from(self.uint()?).ok()?)) }
    }

    fn event(&mut self) -> Option<RawKvEvent> {
        let n = self.map_len()?;
        let mut kind: Option<&'static str> = None;
        let mut block_hashes = None;
        let mut parent_block_hash = None;
        let mut token_ids: Option<Vec<u32>> = None;
        let mut block_size = None;
        let mut medium = None;
        let mut lora_name = None;
        let mut group_idx = None;
        let mut kv_cache_spec_kind = None;
        let mut kv_cache_spec_sliding_window = None;
        for _ in 0..n {
            match self.str()? {
                "type" => {
                    kind = Some(match self.str()? {
                        "BlockStored" => "BlockStored",
                        "BlockRemoved" => "BlockRemoved",
                        "AllBlocksCleared" => "AllBlocksCleared",
                        _ => return None,
                    })
                }
                "block_hashes" => block_hashes = Some(self.hashes()?),
                "parent_block_hash" => {
                    parent_block_hash = Some(if self.nil() { None } else { Some(self.hash()?) });
                }
                "token_ids" => {
                    let n = self.array_len()?;
                    let mut ids = Vec::with_capacity(n.min(self.buf.len()));
                    for _ in 0..n {
                        ids.push(u32::try_from(self.uint()?).ok()?);
                    }
                    token_ids = Some(ids);
                }
                "block_size" => block_size = Some(usize::try_from(self.uint()?).ok()?),
                "medium" => medium = Some(self.opt_string()?),
                "lora_name" => lora_name = Some(self.opt_string()?),
                // The engine's LoRA id: the general decoder ignores it too.
                "lora_id" => {
                    if !self.nil() {
                        self.int()?;
                    }
                }
                // Per-block extra keys: only when none is set (text without salt or media).
                "extra_keys" => {
                    if !self.nil() {
                        for _ in 0..self.array_len()? {
                            if !self.nil() {
                                return None;
                            }
                        }
                    }
                }
                "group_idx" => group_idx = self.opt_u32()?,
                "kv_cache_spec_kind" => {
                    kv_cache_spec_kind = if self.nil() { None } else { Some(spec_kind(self.str()?)?) };
                }
                "kv_cache_spec_sliding_window" => kv_cache_spec_sliding_window = self.opt_u32()?,
                _ => return None,
            }
        }
        let medium = medium.flatten().filter(|m: &String| !m.is_empty());
        match kind? {
            "BlockStored" => Some(RawKvEvent::BlockStored {
                block_hashes: block_hashes?,
                parent_block_hash: parent_block_hash.flatten(),
                token_ids: token_ids?,
                block_size: block_size?,
                medium,
                lora_name: lora_name.flatten(),
                cache_namespace: None,
                block_mm_infos: None,
                is_eagle: Some(false),
                group_idx,
                kv_cache_spec_kind,
                kv_cache_spec_sliding_window,
                locality: None,
                ownership: None,
                session_id: None,
            }),
            "BlockRemoved" => Some(RawKvEvent::BlockRemoved {
                block_hashes: block_hashes?,
                medium,
                group_idx,
                kv_cache_spec_kind,
                kv_cache_spec_sliding_window,
                locality: None,
                ownership: None,
            }),
            _ => Some(RawKvEvent::AllBlocksCleared { ownership: None }),
        }
    }
}

/// The kinds vLLM names; an unknown one is left to the general decoder (which warns).
fn spec_kind(wire: &str) -> Option<KvCacheSpecKind> {
    Some(match wire {
        "full_attention" => KvCacheSpecKind::FullAttention,
        "mla_attention" => KvCacheSpecKind::MlaAttention,
        "sliding_window" => KvCacheSpecKind::SlidingWindow,
        "sliding_window_mla" => KvCacheSpecKind::SlidingWindowMla,
        "mamba" => KvCacheSpecKind::Mamba,
        "chunked_local_attention" => KvCacheSpecKind::ChunkedLocalAttention,
        "sink_full_attention" => KvCacheSpecKind::SinkFullAttention,
        "encoder_only_attention" => KvCacheSpecKind::EncoderOnlyAttention,
        "cross_attention" => KvCacheSpecKind::CrossAttention,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use dynamo_kv_router::zmq_wire::decode_event_batch;
    use proptest::prelude::*;
    use switchyard_sim::engine::KvEvent;
    use switchyard_sim::wire::{WireFormat, encode_batch};

    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    /// Both decoders agree whenever the direct one answers; returns whether it did.
    fn agrees(payload: &[u8]) -> bool {
        let Some(fast) = decode(payload) else { return false };
        let general = decode_event_batch(payload).expect("the general decoder accepts what the direct one does");
        assert_eq!(format!("{fast:?}"), format!("{general:?}"));
        true
    }

    #[test]
    fn vllm_bytes_decode_as_the_general_decoder_decodes_them() {
        // Dumped from vLLM 0.32.0's own structs with msgspec (see `sim/src/wire.rs`).
        for bytes in [
            "93cb3ff80000000000009284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573910ba66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400",
            "93cb3ff8000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920708b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00",
        ] {
            assert!(agrees(&hex(bytes)), "the direct decoder reads vLLM's own bytes");
        }
    }

    #[test]
    fn the_simulators_batches_take_the_direct_path_and_legacy_ones_do_not() {
        let events = [
            KvEvent::BlockStored {
                block_hashes: vec![1, u64::MAX - 3, 1 << 40],
                parent_block_hash: Some(u64::MAX),
                token_ids: (0..48).map(|t| t * 70_001).collect(),
                block_size: 16,
            },
            KvEvent::BlockStored {
                block_hashes: vec![9],
                parent_block_hash: None,
                token_ids: vec![5; 16],
                block_size: 16,
            },
            KvEvent::BlockRemoved { block_hashes: vec![1, u64::MAX - 3] },
            KvEvent::AllBlocksCleared,
        ];
        for dp_rank in [0, 3] {
            assert!(agrees(&encode_batch(12.25, &events, dp_rank, WireFormat::Current)));
            let legacy = encode_batch(12.25, &events, dp_rank, WireFormat::Legacy);
            assert!(decode(&legacy).is_none(), "legacy array-form events go to the general decoder");
            assert!(decode_event_batch(&legacy).is_ok());
        }
        assert!(agrees(&encode_batch(0.0, &[], 0, WireFormat::Current)));
    }

    #[test]
    fn shapes_it_does_not_read_are_left_to_the_general_decoder() {
        let base = encode_batch(
            1.0,
            &[KvEvent::BlockStored {
                block_hashes: vec![7],
                parent_block_hash: None,
                token_ids: vec![1, 2],
                block_size: 2,
            }],
            0,
            WireFormat::Current,
        );
        assert!(decode(&base).is_some());
        let mut trailing = base.clone();
        trailing.push(0xc0);
        assert!(decode(&trailing).is_none(), "trailing bytes");
        for cut in 0..base.len() {
            assert!(decode(&base[..cut]).is_none(), "truncated at {cut}");
        }
    }

    /// One msgpack value of a map-form event, in any of the encodings a producer may choose.
    #[derive(Debug, Clone)]
    enum Value {
        Nil,
        Int(i64),
        Big(u64),
        Str(String),
        Ints(Vec<i64>),
        Nils(usize),
        Salted,
        Pairs(Vec<(u32, u32)>),
    }

    fn write(buf: &mut Vec<u8>, v: &Value, wide: bool) {
        use rmp::encode::*;
        match v {
            Value::Nil => write_nil(buf).expect("vec"),
            Value::Int(i) if wide => write_i64(buf, *i).expect("vec"),
            Value::Int(i) => {
                write_sint(buf, *i).expect("vec");
            }
            Value::Big(u) => write_u64(buf, *u).expect("vec"),
            Value::Str(s) => write_str(buf, s).expect("vec"),
            Value::Ints(is) => {
                write_array_len(buf, is.len() as u32).expect("vec");
                for i in is {
                    write(buf, &Value::Int(*i), wide);
                }
            }
            Value::Nils(n) => {
                write_array_len(buf, *n as u32).expect("vec");
                for _ in 0..*n {
                    write_nil(buf).expect("vec");
                }
            }
            Value::Salted => {
                write_array_len(buf, 1).expect("vec");
                write_array_len(buf, 1).expect("vec");
                write_str(buf, "dynamo-cache-salt:tenant").expect("vec");
            }
            Value::Pairs(ps) => {
                write_array_len(buf, ps.len() as u32).expect("vec");
                for (a, b) in ps {
                    write_array_len(buf, 2).expect("vec");
                    write_uint(buf, u64::from(*a)).expect("vec");
                    write_uint(buf, u64::from(*b)).expect("vec");
                }
            }
        }
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Nil),
            (-3i64..70_000).prop_map(Value::Int),
            any::<i64>().prop_map(Value::Int),
            any::<u64>().prop_map(Value::Big),
            prop_oneof![
                Just("GPU".to_owned()),
                Just(String::new()),
                Just("full_attention".to_owned()),
                Just("sliding_window".to_owned()),
                Just("LOCAL".to_owned()),
                Just("novel_kind".to_owned()),
                Just("BlockStored".to_owned()),
            ]
            .prop_map(Value::Str),
            prop::collection::vec(-2i64..5_000_000_000, 0..40).prop_map(Value::Ints),
            (0usize..4).prop_map(Value::Nils),
            Just(Value::Salted),
            prop::collection::vec((0u32..100, 0u32..100), 0..4).prop_map(Value::Pairs),
        ]
    }

    const KEYS: &[&str] = &[
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
        "cache_salt",
        "locality",
        "ownership",
        "unknown_field",
    ];

    /// An event: its `type` (absent when `None`) and its other fields as (key index, value).
    type TestEvent = (Option<&'static str>, Vec<(usize, Value)>);

    /// Mostly well-formed events (the required fields with valid values) with random extra
    /// or replaced fields, so both paths are exercised.
    fn event() -> impl Strategy<Value = TestEvent> {
        let valid = (
            prop::collection::vec(any::<i64>(), 1..6).prop_map(Value::Ints),
            prop::collection::vec(0i64..100_000, 0..32).prop_map(Value::Ints),
            (1i64..64).prop_map(Value::Int),
        );
        (
            prop_oneof![
                4 => Just(Some("BlockStored")),
                2 => Just(Some("BlockRemoved")),
                1 => Just(Some("AllBlocksCleared")),
                1 => Just(Some("Ignored")),
                1 => Just(None)
            ],
            any::<bool>(),
            valid,
            prop::collection::vec((0..KEYS.len(), value()), 0..4),
        )
            .prop_map(|(kind, with_required, (hashes, tokens, size), extra)| {
                let mut fields = Vec::new();
                if with_required {
                    fields.extend([(0, hashes), (2, tokens), (3, size)]);
                }
                fields.extend(extra);
                (kind, fields)
            })
    }

    #[test]
    fn the_random_events_exercise_both_paths() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = (prop::collection::vec(event(), 1..3), any::<bool>());
        let direct = (0..2_000)
            .filter(|_| {
                let (events, wide) = strategy.new_tree(&mut runner).expect("tree").current();
                agrees(&payload(&events, wide, Some(0)))
            })
            .count();
        assert!((100..1_900).contains(&direct), "{direct} of 2,000 took the direct path");
    }

    fn payload(events: &[TestEvent], wide: bool, dp_rank: Option<i32>) -> Vec<u8> {
        let mut buf = Vec::new();
        rmp::encode::write_array_len(&mut buf, 3).expect("vec");
        rmp::encode::write_f64(&mut buf, 3.5).expect("vec");
        rmp::encode::write_array_len(&mut buf, events.len() as u32).expect("vec");
        for (kind, fields) in events {
            rmp::encode::write_map_len(&mut buf, (fields.len() + usize::from(kind.is_some())) as u32).expect("vec");
            if let Some(kind) = kind {
                rmp::encode::write_str(&mut buf, "type").expect("vec");
                rmp::encode::write_str(&mut buf, kind).expect("vec");
            }
            for (key, v) in fields {
                rmp::encode::write_str(&mut buf, KEYS[*key]).expect("vec");
                write(&mut buf, v, wide);
            }
        }
        match dp_rank {
            Some(r) => write(&mut buf, &Value::Int(i64::from(r)), wide),
            None => rmp::encode::write_nil(&mut buf).expect("vec"),
        }
        buf
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        /// Random events with random fields and value encodings: the direct decoder answers
        /// only where the general one decodes the same batch.
        #[test]
        fn random_events_decode_alike(
            events in prop::collection::vec(event(), 0..4),
            wide in any::<bool>(),
            dp_rank in prop::option::of(-2i32..8),
        ) {
            agrees(&payload(&events, wide, dp_rank));
        }

        /// Well-formed stored and removed events always take the direct path.
        #[test]
        fn plain_events_take_the_direct_path(
            hashes in prop::collection::vec(any::<u64>(), 1..20),
            tokens in prop::collection::vec(0u32..200_000, 0..64),
            parent in prop::option::of(any::<u64>()),
            dp_rank in 0u32..4,
        ) {
            let events = [
                KvEvent::BlockStored { block_hashes: hashes.clone(), parent_block_hash: parent, token_ids: tokens, block_size: 16 },
                KvEvent::BlockRemoved { block_hashes: hashes },
            ];
            prop_assert!(agrees(&encode_batch(1.0, &events, dp_rank, WireFormat::Current)));
        }

        /// Arbitrary bytes never panic, and an answer is always the general decoder's.
        #[test]
        fn arbitrary_bytes_are_safe(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            agrees(&bytes);
        }
    }
}
