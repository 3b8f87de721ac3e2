//! The Rust step loop's own cost per step (the analogue of `benches/engine_step_overhead.py`, delta
//! mode): 1 / 64 / 256 streaming requests decoding over a zero-cost mock executor, every event
//! consumed by another thread, no HTTP. Reports the step period's mean / p50 / p99 over steps 50..950,
//! with async scheduling (the default: update and text in the forward's shadow, which over a
//! zero-cost executor is simply the rest of the period) and without, and the loop thread's CPU time
//! per step (wall time on a shared box includes waiting for a core).
//!
//! `cargo bench -p yoco-server --bench step_loop_overhead`

use std::time::{Duration, Instant};

use yoco_core::kv::LayerKind;
use yoco_core::sched::SchedulerConfig;
use yoco_server::{EngineHandle, Event, GenParams, LoopConfig, MockModel};
use yoco_text::Tokenizer;

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/yoco_rs/default_model/tokenizer.json"
    );
    let tok = Tokenizer::from_file(path).expect("bundled tokenizer");
    let vocab = tok.get_vocab_size(true) as u32;
    println!("| scheduling | streams | mean (µs) | p50 (µs) | p99 (µs) | steps |");
    println!("|---|---|---|---|---|---|");
    for async_scheduling in [true, false] {
        for n in [1u32, 64, 256] {
            let layers = vec![
                LayerKind::Sliding { window: 512 },
                LayerKind::Full,
                LayerKind::SharesKv { donor: 1 },
            ];
            let mut sc = SchedulerConfig::new(layers, 16, n * 1100 / 16 + 64).unwrap();
            sc.max_num_seqs = n;
            sc.max_model_len = 1100;
            let engine = EngineHandle::start(
                LoopConfig {
                    scheduler: sc,
                    tokenizer: tok.clone(),
                    eos_token_ids: vec![1],
                    max_consecutive_failures: 1,
                    async_scheduling,
                },
                Box::new(MockModel::new(vocab, 16, Duration::ZERO)),
            )
            .unwrap();
            engine.stats().take_step_trace(); // start recording before the first step
            let mut rxs = Vec::new();
            for i in 0..n {
                let prompt = tok
                    .encode(format!("Stream {i}: a story about the sea").as_str(), true)
                    .unwrap();
                let p = GenParams {
                    prompt: prompt.get_ids().to_vec(),
                    max_tokens: 1000,
                    ignore_eos: true,
                    stream: true,
                    skip_special_tokens: true,
                    stop: vec!["\n\n\n".into()],
                    ..Default::default()
                };
                rxs.push(engine.submit(p).unwrap().1);
            }
            let consumer = std::thread::spawn(move || {
                let mut events = 0u64;
                let mut live = rxs;
                while !live.is_empty() {
                    live.retain_mut(|rx| loop {
                        match rx.try_recv() {
                            Ok(Event::Finished(_)) => return false,
                            Ok(_) => events += 1,
                            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => return true,
                            Err(_) => return false,
                        }
                    });
                    std::thread::sleep(Duration::from_micros(200));
                }
                events
            });
            // Steps 50..950 of the requests' 1000: steady decode, every stream live.
            let t = Instant::now();
            let mut trace = Vec::new();
            while t.elapsed() < Duration::from_secs(20) && trace.len() < 950 {
                std::thread::sleep(Duration::from_millis(1));
                trace.extend(engine.stats().take_step_trace());
            }
            trace.truncate(950);
            trace.drain(..50.min(trace.len()));
            engine.shutdown();
            let _ = consumer.join();
            trace.sort_unstable();
            let mean = trace.iter().map(|&x| x as f64).sum::<f64>() / trace.len() as f64;
            let p = |q: f64| trace[((trace.len() - 1) as f64 * q) as usize];
            println!(
                "| {} | {n} | {mean:.1} | {} | {} | {} |",
                if async_scheduling { "async" } else { "sync" },
                p(0.5),
                p(0.99),
                trace.len()
            );
        }
    }
}
