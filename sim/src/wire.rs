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
            // Fields without defaults are always present (nil when unset), as msgspec does.
            w_map(buf, 8);
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
        }
        KvEvent::BlockRemoved { block_hashes } => {
            w_map(buf, 3);
            w_str(buf, "type");
            w_str(buf, "BlockRemoved");
            w_str(buf, "block_hashes");
            w_hashes(buf, block_hashes);
            w_str(buf, "medium");
            w_str(buf, "GPU");
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

    /// The byte layout vLLM's msgspec encoder produces (reference dump, current form).
    #[test]
    fn map_form_matches_the_msgspec_layout() {
        let events = [KvEvent::BlockRemoved { block_hashes: vec![11] }, KvEvent::AllBlocksCleared];
        let bytes = encode_batch(1.5, &events, 0, WireFormat::Current);
        let mut want = vec![0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x92];
        want.extend([0x83, 0xa4]);
        want.extend(b"type");
        want.push(0xac);
        want.extend(b"BlockRemoved");
        want.push(0xac);
        want.extend(b"block_hashes");
        want.extend([0x91, 0x0b, 0xa6]);
        want.extend(b"medium");
        want.push(0xa3);
        want.extend(b"GPU");
        want.extend([0x81, 0xa4]);
        want.extend(b"type");
        want.push(0xb0);
        want.extend(b"AllBlocksCleared");
        want.push(0x00);
        assert_eq!(bytes, want);
    }

    #[test]
    fn large_hashes_use_uint64() {
        let bytes =
            encode_batch(0.0, &[KvEvent::BlockRemoved { block_hashes: vec![u64::MAX - 1] }], 0, WireFormat::Legacy);
        let pos = bytes.iter().position(|&b| b == 0xcf).expect("uint64 marker");
        assert_eq!(&bytes[pos + 1..pos + 9], &(u64::MAX - 1).to_be_bytes());
    }
}
