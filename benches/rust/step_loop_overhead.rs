//! The Rust step loop's own cost per step (the analogue of `benches/engine_step_overhead.py`, delta
//! mode): 1 / 64 / 256 streaming requests decoding over a zero-cost mock executor, every event
//! consumed by another thread, no HTTP. Reports, over 600 steps with every stream running, the step
//! period's mean / p50 / p99, the loop thread's CPU time per step (`schedstat`; wall time on a shared
//! box includes waiting for a core), and the time from a step's `collect` returning to the next
//! `launch` (what a device would wait for the loop); with async scheduling (the default: update and
//! text in the forward's shadow, which over a zero-cost executor is simply the rest of the period)
//! and without.
//!
//! `cargo bench -p yoco-server --bench step_loop_overhead`

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use yoco_core::kv::LayerKind;
use yoco_core::sched::SchedulerConfig;
use yoco_server::{EngineHandle, Event, GenParams, LoopConfig, MockModel};
use yoco_text::Tokenizer;

/// CPU time of the step loop's thread (`/proc/self/task/*/schedstat`, ns), 0 when not found.
fn loop_thread_cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for t in dir.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "yoco-step-loop" {
            let st = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            return st
                .split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
        }
    }
    0
}

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/yoco_rs/default_model/tokenizer.json"
    );
    let tok = Tokenizer::from_file(path).expect("bundled tokenizer");
    let vocab = tok.get_vocab_size(true) as u32;
    println!(
        "| scheduling | streams | period mean (µs) | p50 (µs) | p99 (µs) | loop CPU per step (µs) | \
         collect→launch p50 / p99 (µs) | steps | deltas delivered | steps total |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    // `STEP_LOOP_ONLY=async:256` (mode:streams) runs one case: for callgrind, whose per-thread
    // instruction counts over `steps total` are load-independent.
    let only = std::env::var("STEP_LOOP_ONLY").ok();
    for async_scheduling in [true, false] {
        for n in [1u32, 64, 256] {
            let mode = if async_scheduling { "async" } else { "sync" };
            if only.as_ref().is_some_and(|o| *o != format!("{mode}:{n}")) {
                continue;
            }
            let layers = vec![
                LayerKind::Sliding { window: 512 },
                LayerKind::Full,
                LayerKind::SharesKv { donor: 1 },
            ];
            let mut sc = SchedulerConfig::new(layers, 16, n * 4200 / 16 + 64).unwrap();
            sc.max_num_seqs = n;
            sc.max_model_len = 4200;
            let engine = EngineHandle::start(
                LoopConfig {
                    scheduler: sc,
                    tokenizer: tok.clone(),
                    eos_token_ids: vec![1],
                    max_consecutive_failures: 1,
                    async_scheduling,
                    kv_events: None,
                },
                Box::new(MockModel::new(vocab, 16, Duration::ZERO)),
            )
            .unwrap();
            engine.stats().take_step_trace(); // start recording before the first step
            engine.stats().take_gap_trace();
            // Encoded first, then submitted back to back. The stop string never matches (its
            // search is part of the cost measured), so every stream runs 4000 tokens: the window
            // below falls inside every stream's life even when the first ones started long before
            // the rest.
            let params: Vec<GenParams> = (0..n)
                .map(|i| {
                    let prompt = tok
                        .encode(format!("Stream {i}: a story about the sea").as_str(), true)
                        .unwrap();
                    GenParams {
                        prompt: prompt.get_ids().to_vec(),
                        max_tokens: 4000,
                        ignore_eos: true,
                        stream: true,
                        skip_special_tokens: true,
                        stop: vec!["\u{1F980}\u{1F980}\u{1F980}".into()],
                        ..Default::default()
                    }
                })
                .collect();
            let rxs: Vec<_> = params
                .into_iter()
                .map(|p| engine.submit(p).unwrap().1)
                .collect();
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
            // 600 steps once every stream is running (a loaded box may run the first requests
            // alone for a while before the submitting thread gets a core again).
            let t = Instant::now();
            let running = || {
                engine
                    .stats()
                    .running
                    .load(std::sync::atomic::Ordering::Relaxed)
            };
            while running() < n && t.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_micros(100));
            }
            engine.stats().take_step_trace();
            engine.stats().take_gap_trace();
            let cpu0 = loop_thread_cpu_ns();
            let (mut trace, mut gaps) = (Vec::new(), Vec::new());
            while t.elapsed() < Duration::from_secs(20) && trace.len() < 600 {
                std::thread::sleep(Duration::from_micros(500));
                trace.extend(engine.stats().take_step_trace());
                gaps.extend(engine.stats().take_gap_trace());
            }
            let cpu = (loop_thread_cpu_ns() - cpu0) as f64 / trace.len().max(1) as f64 / 1e3;
            let st = engine.stats();
            if running() != n {
                let fin: Vec<u64> = st.finished.iter().map(|f| f.load(Relaxed)).collect();
                eprintln!(
                    "note: {} of {n} streams running after the window (waiting {}, finished {fin:?}, \
                     preemptions {})",
                    running(),
                    st.waiting.load(Relaxed),
                    st.preemptions.load(Relaxed)
                );
            }
            trace.truncate(600);
            gaps.truncate(600);
            engine.shutdown();
            let total_steps = st.steps.load(Relaxed);
            let events = consumer.join().unwrap_or(0);
            trace.sort_unstable();
            gaps.sort_unstable();
            let mean = trace.iter().map(|&x| x as f64).sum::<f64>() / trace.len() as f64;
            let p = |v: &[u32], q: f64| v[((v.len() - 1) as f64 * q) as usize];
            println!(
                "| {mode} | {n} | {mean:.1} | {} | {} | {cpu:.1} | {} / {} | {} | {events} | {total_steps} |",
                p(&trace, 0.5),
                p(&trace, 0.99),
                p(&gaps, 0.5),
                p(&gaps, 0.99),
                trace.len()
            );
        }
    }
}
