//! Random configurations and workloads shared by the randomized scheduler tests (`sched_random.rs`
//! in synchronous mode, `sched_async_random.rs` in both modes), and the expected output of a request
//! alone from the mock's reference function.

use rand::rngs::StdRng;
use rand::Rng;
use yoco_core::kv::{HashExtras, LayerKind};
use yoco_core::mock::MockExecutor;
use yoco_core::sched::{FinishReason, NewRequest, Policy, SchedulerConfig};

/// Vocabulary of the randomized runs (small, so EOS and stop ids are sampled often).
pub const VOCAB: u32 = 48;

/// A request and the step it arrives at.
#[derive(Clone, Debug)]
pub struct Spec {
    pub req: NewRequest,
    pub arrival: u64,
}

/// Expected output and finish reason of a request alone, from the mock's reference function and
/// vLLM's stop rules written out independently.
pub fn expected(mock: &MockExecutor, r: &NewRequest, max_model_len: u32) -> (Vec<u32>, u8) {
    let mut ctx = r.prompt.clone();
    let mut out = Vec::new();
    loop {
        let t = mock.reference_next(&ctx);
        ctx.push(t);
        out.push(t);
        let n = out.len() as u32;
        if n >= r.min_tokens {
            if !r.ignore_eos && r.eos_token_ids.contains(&t) {
                return (out, FinishReason::Stop as u8);
            }
            if r.stop_token_ids.contains(&t) {
                return (out, FinishReason::StopToken as u8);
            }
        }
        if n >= r.max_tokens || ctx.len() as u32 >= max_model_len {
            return (out, FinishReason::Length as u8);
        }
    }
}

/// A random layout, pool, limits and policy.
pub fn random_config(rng: &mut StdRng) -> SchedulerConfig {
    let bs = [2u32, 4, 8, 16][rng.random_range(0..4)];
    let w = rng.random_range(2..40);
    let layers = match rng.random_range(0..4) {
        0 => vec![LayerKind::Full],
        1 => vec![
            LayerKind::Sliding { window: w },
            LayerKind::Full,
            LayerKind::SharesKv { donor: 0 },
            LayerKind::SharesKv { donor: 1 },
        ],
        2 => vec![
            LayerKind::Sliding { window: w },
            LayerKind::Sliding { window: w },
            LayerKind::Full,
            LayerKind::SharesKv { donor: 1 },
        ],
        _ => vec![LayerKind::Full, LayerKind::Sliding { window: w }],
    };
    let max_model_len = rng.random_range(24..160u32);
    let mut c = SchedulerConfig::new(layers, bs, 2).unwrap();
    c.max_model_len = max_model_len;
    c.max_num_seqs = rng.random_range(1..12);
    c.max_num_batched_tokens = rng.random_range(1..96);
    c.long_prefill_token_threshold = if rng.random_bool(0.3) {
        rng.random_range(1..32)
    } else {
        0
    };
    c.policy = if rng.random_bool(0.3) {
        Policy::Priority
    } else {
        Policy::Fcfs
    };
    c.max_admission_skips = rng.random_range(0..4);
    c.kv.enable_prefix_caching = rng.random_bool(0.8);
    c.kv.enable_events = rng.random_bool(0.2);
    let subs: Vec<u32> = (1..=bs).filter(|d| bs % d == 0).collect();
    c.kv.sub_block_size = subs[rng.random_range(0..subs.len())];
    if rng.random_bool(0.3) {
        c.token_capture_sizes = vec![1, 2, 4, 8, 16, 32, 64];
        c.cross_capture_sizes = vec![1, 2, 4, 8];
    }
    // Pools from "one longest sequence" (heavy preemption) to roomy.
    let one_seq = max_model_len.div_ceil(bs) + 1;
    let n = one_seq + rng.random_range(0..one_seq * 3);
    let groups = yoco_core::kv::kv_groups(&c.layers).unwrap().len();
    c.kv.num_blocks = (0..groups).map(|_| n + rng.random_range(0..4)).collect();
    c
}

/// `n` random requests (shared prefixes, EOS and stop ids, salts, prompt logprobs, `n > 1` siblings)
/// in arrival order.
pub fn random_requests(rng: &mut StdRng, c: &SchedulerConfig, n: usize) -> Vec<Spec> {
    let bases: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..rng.random_range(1..48))
                .map(|_| rng.random_range(0..VOCAB))
                .collect()
        })
        .collect();
    let mut specs: Vec<Spec> = Vec::new();
    let mut arrival = 0;
    for i in 0..n {
        arrival += rng.random_range(0..3u64);
        let mut prompt: Vec<u32> = if rng.random_bool(0.6) {
            let b = &bases[rng.random_range(0..bases.len())];
            b[..rng.random_range(1..=b.len())].to_vec()
        } else {
            Vec::new()
        };
        let extra = rng.random_range(if prompt.is_empty() { 1 } else { 0 }..24);
        prompt.extend((0..extra).map(|_| rng.random_range(0..VOCAB)));
        prompt.truncate(c.max_model_len as usize);
        let mut req = NewRequest {
            id: i as u64,
            max_tokens: rng.random_range(1..20),
            min_tokens: 0,
            eos_token_ids: if rng.random_bool(0.7) {
                vec![rng.random_range(0..VOCAB)]
            } else {
                vec![]
            },
            stop_token_ids: if rng.random_bool(0.2) {
                vec![rng.random_range(0..VOCAB)]
            } else {
                vec![]
            },
            ignore_eos: rng.random_bool(0.1),
            priority: rng.random_range(-2..3),
            hash_extras: HashExtras {
                cache_salt: if rng.random_bool(0.1) {
                    Some("salt".into())
                } else {
                    None
                },
                lora: None,
            },
            prompt_logprobs: rng.random_bool(0.1),
            after: None,
            prompt,
        };
        req.min_tokens = rng.random_range(0..=req.max_tokens.min(3));
        // n > 1 siblings: the same prompt, admitted after the parent's prompt is computed.
        if i > 0 && rng.random_bool(0.15) {
            let parent = &specs[rng.random_range(0..i)];
            req.prompt = parent.req.prompt.clone();
            req.hash_extras = parent.req.hash_extras.clone();
            req.after = Some(parent.req.id);
            arrival = arrival.max(parent.arrival);
        }
        specs.push(Spec { req, arrival });
    }
    specs
}
