//! A profiling target for the steady-state decode step: the same setup as `sched_decode` (N running
//! requests, 128-token prompts, block 16, prefilled first), then `--steps` decode steps inside one
//! `#[inline(never)]` function, so a profiler can count exactly those:
//!
//! ```text
//! cargo bench -p yoco-core --bench sched_profile --no-run   # prints the executable
//! valgrind --tool=callgrind --toggle-collect='*sched_profile*measured_steps*' \
//!     EXE --layout gemma3n --n 256 --steps 1024
//! ```
//!
//! Instruction counts (callgrind `Ir`) are deterministic, so before/after comparisons on a shared,
//! noisy machine are exact ratios. Without a profiler it prints thread CPU µs per step.
//! Options: `--layout full|gemma3n` (default gemma3n), `--n N` (256), `--steps K` (1024),
//! `--events` (the core collects KV events and hands them over after every step by buffer swap,
//! as a running publisher takes them: the core's share of publishing events).

#[path = "cpu_time.rs"]
mod cpu_time;
#[path = "decode_setup.rs"]
mod decode_setup;

use decode_setup::{decoding_with_events, full, gemma3n};
use yoco_core::kv::KvEventBatch;
use yoco_core::sched::Scheduler;

/// The measured region: `steps` decode steps (`schedule()` + `update()`), plus the hand-over of
/// the step's KV events when `events` (swapping with the batch taken the step before, as a
/// publisher that returns its emptied batches does).
#[inline(never)]
fn measured_steps(s: &mut Scheduler, sampled: &[i32], steps: u32, events: bool) {
    let mut spare = KvEventBatch::new();
    for _ in 0..steps {
        s.schedule();
        s.update(sampled).unwrap();
        if events && s.has_kv_events() {
            spare = s.swap_kv_events(spare);
        }
    }
}

fn main() {
    let mut layout = "gemma3n".to_string();
    let (mut n, mut steps) = (256u32, 1024u32);
    let mut events = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().expect("option needs a value");
        match a.as_str() {
            "--layout" => layout = val(),
            "--n" => n = val().parse().expect("--n N"),
            "--steps" => steps = val().parse().expect("--steps K"),
            "--events" => events = true,
            "--bench" => {} // cargo bench passes it
            other => {
                panic!("unknown option {other} (--layout full|gemma3n, --n N, --steps K, --events)")
            }
        }
    }
    let layers = match layout.as_str() {
        "full" => full(),
        "gemma3n" => gemma3n(),
        other => panic!("--layout {other}: full or gemma3n"),
    };
    let mut s = decoding_with_events(n, steps, layers.clone(), events);
    let sampled = vec![100i32; n as usize];
    let t = cpu_time::thread_ns();
    measured_steps(&mut s, &sampled, steps, events);
    let ns = cpu_time::thread_ns() - t;
    assert_eq!(
        s.stats().num_running,
        n,
        "no request finished or was preempted"
    );
    // The halves, timed separately on a fresh run (two more clock reads per step).
    let mut s = decoding_with_events(n, steps, layers, events);
    let (mut sched_ns, mut update_ns) = (0, 0);
    // By step phase modulo the block size: the lockstep requests all complete a block together.
    let mut phase = [(0u64, 0u64); 16];
    for i in 0..steps {
        let t0 = cpu_time::thread_ns();
        s.schedule();
        let t1 = cpu_time::thread_ns();
        s.update(&sampled).unwrap();
        let t2 = cpu_time::thread_ns();
        sched_ns += t1 - t0;
        update_ns += t2 - t1;
        phase[i as usize % 16].0 += t1 - t0;
        phase[i as usize % 16].1 += t2 - t1;
    }
    if std::env::var_os("PHASES").is_some() {
        for (k, (a, b)) in phase.iter().enumerate() {
            let per = |x: u64| x as f64 / (steps / 16) as f64 / 1e3;
            println!(
                "phase {k:2}: schedule {:7.2} update {:7.2}",
                per(*a),
                per(*b)
            );
        }
    }
    let per = |x: u64| x as f64 / steps as f64 / 1e3;
    println!(
        "layout {layout}, N {n}, {steps} steps, events {events}: {:.2} us/step (thread CPU); schedule {:.2} + update {:.2}",
        per(ns),
        per(sched_ns),
        per(update_ns)
    );
}
