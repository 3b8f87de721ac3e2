//! Shared by the decode-step benches (`sched_decode`, `sched_profile`): the layouts and a scheduler
//! with N requests already prefilled, so every measured step is a pure decode.

use yoco_core::kv::LayerKind;
use yoco_core::sched::{NewRequest, Scheduler, SchedulerConfig};

/// One full-attention layer: a single KV group.
pub fn full() -> Vec<LayerKind> {
    vec![LayerKind::Full]
}

/// Gemma 3n E2B's 30 layers: 4 sliding (W 512) per full, the last 10 sharing layers 18/19's KV.
pub fn gemma3n() -> Vec<LayerKind> {
    let mut l: Vec<LayerKind> = (0..20)
        .map(|i| {
            if i % 5 == 4 {
                LayerKind::Full
            } else {
                LayerKind::Sliding { window: 512 }
            }
        })
        .collect();
    l.extend((20..30).map(|i| LayerKind::SharesKv {
        donor: if i % 5 == 4 { 19 } else { 18 },
    }));
    l
}

/// `n` requests with 128-token prompts (block 16), prefilled, with room for `steps` more decode
/// steps before any finishes.
#[allow(dead_code)] // each bench binary includes this module and uses part of it
pub fn decoding(n: u32, steps: u32, layers: Vec<LayerKind>) -> Scheduler {
    decoding_with_events(n, steps, layers, false)
}

/// [`decoding`] with the core collecting KV events (`kv.enable_events`) when `events`.
pub fn decoding_with_events(n: u32, steps: u32, layers: Vec<LayerKind>, events: bool) -> Scheduler {
    let bs = 16;
    let len = 128 + steps + 16;
    let mut c = SchedulerConfig::new(layers, bs, n * len.div_ceil(bs) + 64).unwrap();
    c.max_num_seqs = n;
    c.max_model_len = len;
    c.kv.enable_events = events;
    let mut s = Scheduler::new(c).unwrap();
    for i in 0..n {
        let prompt = (0..128)
            .map(|t| 16 + (i * 7919 + t * 104_729) % 31_000)
            .collect();
        s.add_request(NewRequest {
            id: i as u64,
            prompt,
            max_tokens: len - 128,
            eos_token_ids: vec![2],
            ..Default::default()
        })
        .unwrap();
    }
    while s.plan().max_query_len != 1 {
        let k = s.schedule().num_samples();
        s.update(&vec![100; k]).unwrap();
    }
    s
}
