//! vLLM's KV-event wire format.
//!
//! A batch is a ZMQ multipart message `[topic, seq (8 bytes, big-endian), payload]`, where the
//! payload is msgpack `[ts: f64, events: [...], data_parallel_rank: int]`. Events are encoded
//! either as tagged maps (vLLM ≥ 0.26, key `"type"`) or as tagged positional arrays (older
//! releases); both are produced here so routers can be tested against either.
//!
//! Replay (ROUTER socket): a request `[identity, "", start_seq]` is answered with every
//! buffered batch `seq >= start_seq` and an end marker whose seq is `u64::MAX` and payload
//! empty. The current form puts the topic before the seq; the legacy form omits it.

use crate::engine::KvEvent;

/// Which encoding of events and replay replies to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// Events as maps with a `"type"` key; replay replies carry the topic.
    #[default]
    Current,
    /// Events as positional arrays with the tag first; replay replies without topic.
    Legacy,
}

/// Sequence number of the replay end marker.
pub const END_SEQ: u64 = u64::MAX;

impl std::str::FromStr for WireFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "current" | "map" => Ok(WireFormat::Current),
            "legacy" | "array" => Ok(WireFormat::Legacy),
            other => Err(format!("unknown wire format `{other}` (use current or legacy)")),
        }
    }
}

// Writing into a Vec cannot fail; the helpers below swallow the impossible error so the
// encoder stays total.
fn w_array(buf: &mut Vec<u8>, n: usize) {
    let _ = rmp::encode::write_array_len(buf, n as u32);
}
fn w_map(buf: &mut Vec<u8>, n: usize) {
    let _ = rmp::encode::write_map_len(buf, n as u32);
}
fn w_str(buf: &mut Vec<u8>, s: &str) {
    let _ = rmp::encode::write_str(buf, s);
}
fn w_uint(buf: &mut Vec<u8>, v: u64) {
    let _ = rmp::encode::write_uint(buf, v);
}
fn w_nil(buf: &mut Vec<u8>) {
    let _ = rmp::encode::write_nil(buf);
}
fn w_hashes(buf: &mut Vec<u8>, hashes: &[u64]) {
    w_array(buf, hashes.len());
    for &h in hashes {
        w_uint(buf, h);
    }
}
fn w_opt_hash(buf: &mut Vec<u8>, h: Option<u64>) {
    match h {
        Some(h) => w_uint(buf, h),
        None => w_nil(buf),
    }
}

/// Encodes one batch payload.
pub fn encode_batch(ts: f64, events: &[KvEvent], dp_rank: u32, format: WireFormat) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64 + events.len() * 64);
    w_array(&mut buf, 3);
    let _ = rmp::encode::write_f64(&mut buf, ts);
    w_array(&mut buf, events.len());
    for e in events {
        match format {
            WireFormat::Current => encode_map_event(&mut buf, e),
            WireFormat::Legacy => encode_array_event(&mut buf, e),
        }
    }
    w_uint(&mut buf, u64::from(dp_rank));
    buf
}

fn encode_map_event(buf: &mut Vec<u8>, e: &KvEvent) {
    match e {
        KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size } => {
            // As vLLM's msgspec structs (omit_defaults): fields without defaults always (nil
            // when unset), defaulted ones only when set — extra keys (none per block), the KV
            // cache group and its kind.
            w_map(buf, 11);
            w_str(buf, "type");
            w_str(buf, "BlockStored");
            w_str(buf, "block_hashes");
            w_hashes(buf, block_hashes);
            w_str(buf, "parent_block_hash");
            w_opt_hash(buf, *parent_block_hash);
            w_str(buf, "token_ids");
            w_array(buf, token_ids.len());
            for &t in token_ids {
                w_uint(buf, u64::from(t));
            }
            w_str(buf, "block_size");
            w_uint(buf, u64::from(*block_size));
            w_str(buf, "lora_id");
            w_nil(buf);
            w_str(buf, "medium");
            w_str(buf, "GPU");
            w_str(buf, "lora_name");
            w_nil(buf);
            w_str(buf, "extra_keys");
            w_array(buf, block_hashes.len());
            for _ in block_hashes {
                w_nil(buf);
            }
            w_str(buf, "group_idx");
            w_uint(buf, 0);
            w_str(buf, "kv_cache_spec_kind");
            w_str(buf, "full_attention");
        }
        KvEvent::BlockRemoved { block_hashes } => {
            w_map(buf, 4);
            w_str(buf, "type");
            w_str(buf, "BlockRemoved");
            w_str(buf, "block_hashes");
            w_hashes(buf, block_hashes);
            w_str(buf, "medium");
            w_str(buf, "GPU");
            w_str(buf, "group_idx");
            w_uint(buf, 0);
        }
        KvEvent::AllBlocksCleared => {
            w_map(buf, 1);
            w_str(buf, "type");
            w_str(buf, "AllBlocksCleared");
        }
    }
}

fn encode_array_event(buf: &mut Vec<u8>, e: &KvEvent) {
    match e {
        KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size } => {
            // [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]
            w_array(buf, 8);
            w_str(buf, "BlockStored");
            w_hashes(buf, block_hashes);
            w_opt_hash(buf, *parent_block_hash);
            w_array(buf, token_ids.len());
            for &t in token_ids {
                w_uint(buf, u64::from(t));
            }
            w_uint(buf, u64::from(*block_size));
            w_nil(buf);
            w_str(buf, "GPU");
            w_nil(buf);
        }
        KvEvent::BlockRemoved { block_hashes } => {
            w_array(buf, 3);
            w_str(buf, "BlockRemoved");
            w_hashes(buf, block_hashes);
            w_str(buf, "GPU");
        }
        KvEvent::AllBlocksCleared => {
            w_array(buf, 1);
            w_str(buf, "AllBlocksCleared");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    /// Byte for byte what vLLM 0.32.0's own structs encode to (`KVEventBatch` with msgspec's
    /// msgpack encoder, dumped from the real package).
    #[test]
    fn map_form_matches_vllm_bytes() {
        let events = [KvEvent::BlockRemoved { block_hashes: vec![11] }, KvEvent::AllBlocksCleared];
        assert_eq!(
            encode_batch(1.5, &events, 0, WireFormat::Current),
            hex(
                "93cb3ff80000000000009284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573910ba66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
            )
        );
        let stored = [KvEvent::BlockStored {
            block_hashes: vec![7, 8],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
        }];
        assert_eq!(
            encode_batch(1.5, &stored, 0, WireFormat::Current),
            hex(
                "93cb3ff8000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920708b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"
            )
        );
    }

    #[test]
    fn large_hashes_use_uint64() {
        let bytes =
            encode_batch(0.0, &[KvEvent::BlockRemoved { block_hashes: vec![u64::MAX - 1] }], 0, WireFormat::Legacy);
        let pos = bytes.iter().position(|&b| b == 0xcf).expect("uint64 marker");
        assert_eq!(&bytes[pos + 1..pos + 9], &(u64::MAX - 1).to_be_bytes());
    }
}
