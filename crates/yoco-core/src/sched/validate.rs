//! Configuration and request validation: every error names the field, the value, and what would work.

use super::config::SchedulerConfig;
use super::request::NewRequest;
use crate::error::{Error, Result};
use crate::kv::{AttnKind, KvGroup, MmPlaceholder};

pub(super) fn config(c: &SchedulerConfig) -> Result<()> {
    let bad = |m: String| Err(Error::Config(m));
    if c.max_num_seqs == 0 {
        return bad("max_num_seqs must be >= 1, got 0".into());
    }
    if c.max_num_seqs > i32::MAX as u32 {
        return bad(format!(
            "max_num_seqs must fit in int32, got {}",
            c.max_num_seqs
        ));
    }
    if c.max_num_batched_tokens == 0 {
        return bad("max_num_batched_tokens must be >= 1, got 0".into());
    }
    if c.max_model_len == 0 {
        return bad("max_model_len must be >= 1, got 0".into());
    }
    if c.max_num_encoder_input_tokens == 0 {
        return bad("max_num_encoder_input_tokens must be >= 1, got 0".into());
    }
    if c.max_model_len > i32::MAX as u32 {
        return bad(format!(
            "max_model_len must fit in int32 positions, got {}",
            c.max_model_len
        ));
    }
    if c.kv.block_size == 0 {
        return bad("block_size must be >= 1, got 0".into());
    }
    for (name, sizes) in [
        ("token_capture_sizes", &c.token_capture_sizes),
        ("cross_capture_sizes", &c.cross_capture_sizes),
    ] {
        if sizes.windows(2).any(|w| w[0] >= w[1]) || sizes.first() == Some(&0) {
            return bad(format!(
                "{name} must be strictly ascending positive sizes, got {sizes:?}"
            ));
        }
    }
    Ok(())
}

/// Blocks group `g` must be able to give one request of `len` tokens at once.
pub(super) fn blocks_needed(
    group: &KvGroup,
    len: u32,
    block_size: u32,
    max_num_batched_tokens: u32,
) -> u32 {
    let full = len.div_ceil(block_size);
    match group.kind {
        AttnKind::Full => full,
        // The window behind the oldest query of a step, plus the step's tokens, plus one block of
        // misalignment.
        AttnKind::Sliding { window } => {
            full.min((window.saturating_sub(1) + max_num_batched_tokens).div_ceil(block_size) + 1)
        }
    }
}

pub(super) fn request(c: &SchedulerConfig, groups: &[KvGroup], r: &NewRequest) -> Result<()> {
    let bad = |m: String| Err(Error::Request(format!("request {}: {m}", r.id)));
    if r.prompt.is_empty() {
        return bad("prompt is empty; it needs at least 1 token".into());
    }
    if r.prompt.len() as u64 > c.max_model_len as u64 {
        return bad(format!(
            "prompt has {} tokens, more than max_model_len = {}; shorten it to at most {} tokens",
            r.prompt.len(),
            c.max_model_len,
            c.max_model_len
        ));
    }
    if r.max_tokens == 0 {
        return bad("max_tokens must be >= 1, got 0".into());
    }
    if r.min_tokens > r.max_tokens {
        return bad(format!(
            "min_tokens = {} exceeds max_tokens = {}; use min_tokens <= max_tokens",
            r.min_tokens, r.max_tokens
        ));
    }
    if r.after == Some(r.id) {
        return bad(
            "after names the request itself; it must name another (earlier) request".into(),
        );
    }
    let len = (r.prompt.len() as u64 + r.max_tokens as u64).min(c.max_model_len as u64) as u32;
    for (g, group) in groups.iter().enumerate() {
        let need = blocks_needed(group, len, c.kv.block_size, c.max_num_batched_tokens);
        let have = c.kv.num_blocks[g].saturating_sub(1);
        if need > have {
            return Err(Error::Capacity(format!(
                "request {}: {} tokens (prompt {} + max_tokens {}, capped at max_model_len {}) need {} blocks of {} tokens in KV group {}, whose pool has {} usable blocks; raise num_blocks to at least {} or lower max_tokens",
                r.id,
                len,
                r.prompt.len(),
                r.max_tokens,
                c.max_model_len,
                need,
                c.kv.block_size,
                g,
                have,
                need + 1
            )));
        }
    }
    Ok(())
}

/// Multimodal placeholder runs of request `id` with a prompt of `prompt_len` tokens: non-empty,
/// inside the prompt, sorted and disjoint, each within the step's encoder budget (else it could
/// never be scheduled), with a non-empty identifier.
pub(super) fn mm_items(
    c: &SchedulerConfig,
    id: u64,
    prompt_len: usize,
    items: &[MmPlaceholder],
) -> Result<()> {
    let bad = |m: String| Err(Error::Request(format!("request {id}: {m}")));
    let mut prev_end = 0u64;
    for (i, m) in items.iter().enumerate() {
        if m.length == 0 {
            return bad(format!(
                "multimodal item {i} has an empty placeholder run (length 0)"
            ));
        }
        if m.end() > prompt_len as u64 {
            return bad(format!(
                "multimodal item {i} covers tokens {}..{}, past the prompt's {prompt_len} tokens",
                m.offset,
                m.end()
            ));
        }
        if (m.offset as u64) < prev_end {
            return bad(format!(
                "multimodal item {i} starts at token {}, inside or before the previous item (ending at {prev_end}); items must be sorted and disjoint",
                m.offset
            ));
        }
        if m.length > c.max_num_encoder_input_tokens {
            return bad(format!(
                "multimodal item {i} needs {} encoder tokens, more than max_num_encoder_input_tokens = {}; raise it to at least {}",
                m.length, c.max_num_encoder_input_tokens, m.length
            ));
        }
        if m.identifier.is_empty() {
            return bad(format!(
                "multimodal item {i} has an empty identifier (its content hash)"
            ));
        }
        prev_end = m.end();
    }
    Ok(())
}
