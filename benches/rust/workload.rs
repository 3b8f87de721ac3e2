//! Loader of `peer-bench-workload/1` files (`/work/shared/bench/README.md` §1, mirrored in
//! `benches/workload.py`): requests with arrival steps and prompts made of seeded splitmix64
//! segments, shared named segments and literal tokens. Included with `#[path]` by the scheduler
//! benches and tests (it needs `serde_json`, a dev-dependency only).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

pub const FORMAT: &str = "peer-bench-workload/1";
/// Token ids below this are never generated (EOS is 2).
pub const FIRST_TOKEN: u32 = 16;
pub const EOS_TOKEN: u32 = 2;

#[derive(Debug, Clone)]
pub struct WorkloadRequest {
    /// 0-based position in the file.
    pub index: usize,
    pub id: String,
    pub arrival_step: u64,
    pub max_tokens: u32,
    pub prompt: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub vocab_size: u32,
    pub max_num_seqs: Option<u32>,
    pub max_num_batched_tokens: Option<u32>,
    pub block_size: Option<u32>,
    pub num_blocks: Option<u32>,
    pub requests: Vec<WorkloadRequest>,
}

/// Token `i` of a `{"len", "seed"}` segment: splitmix64 with wrapping arithmetic.
pub fn gen_tokens(seed: u64, len: usize, vocab_size: u32) -> Vec<u32> {
    let span = (vocab_size - FIRST_TOKEN) as u64;
    (0..len as u64)
        .map(|i| {
            let mut z = seed.wrapping_add((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BE_B5D4_B133);
            z ^= z >> 31;
            FIRST_TOKEN + (z % span) as u32
        })
        .collect()
}

/// The peers' fake sampled token: output `k` of request `j`.
pub fn output_token(j: usize, k: u32, vocab_size: u32) -> u32 {
    FIRST_TOKEN + ((j as u64 * 131 + k as u64) % (vocab_size - FIRST_TOKEN) as u64) as u32
}

fn expand(
    seg: &Value,
    shared: &Value,
    vocab: u32,
    cache: &mut HashMap<String, Vec<u32>>,
) -> Result<Vec<u32>, String> {
    if let Some(name) = seg.get("ref").and_then(Value::as_str) {
        if !cache.contains_key(name) {
            let def = shared
                .get(name)
                .ok_or_else(|| format!("unknown shared segment {name:?}"))?;
            let toks = expand(def, shared, vocab, cache)?;
            cache.insert(name.to_string(), toks);
        }
        return Ok(cache[name].clone());
    }
    if let Some(toks) = seg.get("tokens").and_then(Value::as_array) {
        return toks
            .iter()
            .map(|t| {
                t.as_u64()
                    .map(|x| x as u32)
                    .ok_or_else(|| format!("bad token {t}"))
            })
            .collect();
    }
    let seed = seg
        .get("seed")
        .and_then(Value::as_u64)
        .ok_or("segment without seed")?;
    let len = seg
        .get("len")
        .and_then(Value::as_u64)
        .ok_or("segment without len")?;
    Ok(gen_tokens(seed, len as usize, vocab))
}

pub fn parse(text: &str) -> Result<Workload, String> {
    let spec: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if spec.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(format!(
            "expected format {FORMAT:?}, got {:?}",
            spec.get("format")
        ));
    }
    let vocab = spec
        .get("vocab_size")
        .and_then(Value::as_u64)
        .unwrap_or(32000) as u32;
    let shared = spec.get("shared_segments").cloned().unwrap_or(Value::Null);
    let engine = spec.get("engine").cloned().unwrap_or(Value::Null);
    let eng = |k: &str| engine.get(k).and_then(Value::as_u64).map(|x| x as u32);
    let mut cache = HashMap::new();
    let mut requests = Vec::new();
    for (j, r) in spec
        .get("requests")
        .and_then(Value::as_array)
        .ok_or("no requests")?
        .iter()
        .enumerate()
    {
        let mut prompt = Vec::new();
        for seg in r
            .get("prompt")
            .and_then(Value::as_array)
            .ok_or("request without prompt")?
        {
            prompt.extend(expand(seg, &shared, vocab, &mut cache)?);
        }
        if prompt.is_empty() {
            return Err(format!("request {j} has an empty prompt"));
        }
        requests.push(WorkloadRequest {
            index: j,
            id: r
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| j.to_string(), str::to_string),
            arrival_step: r.get("arrival_step").and_then(Value::as_u64).unwrap_or(0),
            max_tokens: r
                .get("max_tokens")
                .and_then(Value::as_u64)
                .ok_or("request without max_tokens")? as u32,
            prompt,
        });
    }
    Ok(Workload {
        name: spec
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string(),
        vocab_size: vocab,
        max_num_seqs: eng("max_num_seqs"),
        max_num_batched_tokens: eng("max_num_batched_tokens"),
        block_size: eng("block_size"),
        num_blocks: eng("num_blocks"),
        requests,
    })
}

pub fn load(path: &Path) -> Result<Workload, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

impl Workload {
    /// `engine.num_blocks`, else Σ ceil((prompt + max_tokens) / block_size) + 64 (never short).
    pub fn num_blocks(&self, block_size: u32) -> u32 {
        self.num_blocks.unwrap_or_else(|| {
            self.requests
                .iter()
                .map(|r| (r.prompt.len() as u32 + r.max_tokens).div_ceil(block_size))
                .sum::<u32>()
                + 64
        })
    }

    pub fn max_seq_len(&self) -> u32 {
        self.requests
            .iter()
            .map(|r| r.prompt.len() as u32 + r.max_tokens)
            .max()
            .unwrap_or(1)
    }
}
