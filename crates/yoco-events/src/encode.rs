//! `KVEventBatch` payloads, byte-for-byte as vLLM's msgspec encoder writes them.
//!
//! The batch is always the positional array `[ts, events, data_parallel_rank]` (msgspec
//! `array_like=True`; msgspec writes every field of an array-like struct, defaults included, as
//! the golden bytes, made with msgspec itself, show). Events come in two shapes because consumers
//! disagree (`shared/docs/serving.md` §3a):
//! * [`Encoding::Array`], vLLM's documented form (`array_like=True, tag=True`), which llm-d's
//!   indexer decodes: `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//!   lora_id, medium, lora_name, extra_keys, group_idx]` and `["BlockRemoved", block_hashes,
//!   medium, group_idx]`;
//! * [`Encoding::Map`], maps tagged by `type`, which vllm-router 0.1.17 requires:
//!   `{"type": "BlockStored", "block_hashes": ..., ...}`, fields equal to their default
//!   (`extra_keys`, `group_idx`) left out (msgspec `omit_defaults=True`).

use crate::msgpack::Writer;
use crate::wire::WireEvent;

/// How events are laid out inside the (always positional) batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Positional arrays tagged by their first element (vLLM's docs, llm-d).
    #[default]
    Array,
    /// Maps tagged by a `type` key (vllm-router 0.1.17).
    Map,
}

impl std::str::FromStr for Encoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "array" => Ok(Encoding::Array),
            "map" => Ok(Encoding::Map),
            _ => Err(format!(
                "kv-events encoding must be 'array' or 'map', got {s:?}"
            )),
        }
    }
}

fn opt_uint(w: &mut Writer, v: Option<u64>) {
    match v {
        Some(v) => w.uint(v),
        None => w.nil(),
    }
}

fn event_array(w: &mut Writer, e: &WireEvent, medium: &str) {
    match e {
        WireEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            group_idx,
        } => {
            w.array(10);
            w.str("BlockStored");
            w.uints(block_hashes);
            opt_uint(w, *parent_block_hash);
            w.uints(token_ids);
            w.uint(u64::from(*block_size));
            w.nil(); // lora_id (deprecated)
            w.str(medium);
            w.nil(); // lora_name
            w.nil(); // extra_keys
            opt_uint(w, group_idx.map(u64::from));
        }
        WireEvent::BlockRemoved {
            block_hashes,
            group_idx,
        } => {
            w.array(4);
            w.str("BlockRemoved");
            w.uints(block_hashes);
            w.str(medium);
            opt_uint(w, group_idx.map(u64::from));
        }
        WireEvent::AllBlocksCleared => {
            w.array(1);
            w.str("AllBlocksCleared");
        }
    }
}

fn event_map(w: &mut Writer, e: &WireEvent, medium: &str) {
    match e {
        WireEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            group_idx,
        } => {
            w.map(if group_idx.is_some() { 9 } else { 8 });
            w.str("type");
            w.str("BlockStored");
            w.str("block_hashes");
            w.uints(block_hashes);
            w.str("parent_block_hash");
            opt_uint(w, *parent_block_hash);
            w.str("token_ids");
            w.uints(token_ids);
            w.str("block_size");
            w.uint(u64::from(*block_size));
            w.str("lora_id");
            w.nil();
            w.str("medium");
            w.str(medium);
            w.str("lora_name");
            w.nil();
            if let Some(g) = group_idx {
                w.str("group_idx");
                w.uint(u64::from(*g));
            }
        }
        WireEvent::BlockRemoved {
            block_hashes,
            group_idx,
        } => {
            w.map(if group_idx.is_some() { 4 } else { 3 });
            w.str("type");
            w.str("BlockRemoved");
            w.str("block_hashes");
            w.uints(block_hashes);
            w.str("medium");
            w.str(medium);
            if let Some(g) = group_idx {
                w.str("group_idx");
                w.uint(u64::from(*g));
            }
        }
        WireEvent::AllBlocksCleared => {
            w.map(1);
            w.str("type");
            w.str("AllBlocksCleared");
        }
    }
}

/// Encodes one `KVEventBatch` (`ts` in seconds since the epoch; `medium` e.g. `"GPU"`).
pub fn encode_batch(
    ts: f64,
    events: &[WireEvent],
    data_parallel_rank: Option<i64>,
    encoding: Encoding,
    medium: &str,
) -> Vec<u8> {
    let mut w = Writer::default();
    w.array(3);
    w.f64(ts);
    w.array(events.len());
    for e in events {
        match encoding {
            Encoding::Array => event_array(&mut w, e, medium),
            Encoding::Map => event_map(&mut w, e, medium),
        }
    }
    match data_parallel_rank {
        Some(r) => w.int(r),
        None => w.nil(),
    }
    w.buf
}
