//! Structured outputs in the Rust step loop: the step period with 64 constrained streams vs 64
//! unconstrained ones, behind a mock forward of 5 ms (slept after `launch` returns, as a device
//! computes while the loop works). The loop starts each step's grammar job (advance the matchers by
//! the last step's tokens, then the masks of this step's rows) on the grammar pool before `launch`;
//! the mock takes the masks after its forward, so they should hide behind it: target <= 1.05x (issue
//! 15's bench 2, now through the Rust loop). Also the loop thread's own CPU per step (from
//! `/proc/self/task/*/stat`, 10 ms ticks over the window): what structured outputs add to the loop.
//!
//! Rows decode under a JSON schema that never ends (an array of at least 10,000 integers, compact),
//! so every step masks every row. Runs alternate (constrained, unconstrained) `REPS` times.
//!
//! `cargo bench -p yoco-server --bench structured_loop`

use std::sync::Arc;
use std::time::{Duration, Instant};

use yoco_core::kv::LayerKind;
use yoco_core::sched::SchedulerConfig;
use yoco_grammar::{CompileLimits, GrammarCompiler, GrammarKind, GrammarSpec};
use yoco_server::params::Grammar;
use yoco_server::{EngineHandle, Event, GenParams, LoopConfig, MockModel};
use yoco_text::Tokenizer;

const ROWS: u32 = 64;
const STEPS: usize = 300;
const REPS: usize = 3;
const FORWARD: Duration = Duration::from_millis(5);

/// CPU time (ns) of this process's thread named `name` (utime + stime, clock ticks of 10 ms).
fn thread_cpu_ns(name: &str) -> Option<u64> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            return Some(ticks * 10_000_000);
        }
    }
    None
}

fn run(tok: &Tokenizer, grammar: Option<&Grammar>) -> (f64, u32, f64) {
    let vocab = tok.get_vocab_size(true) as u32;
    let layers = vec![
        LayerKind::Sliding { window: 512 },
        LayerKind::Full,
        LayerKind::SharesKv { donor: 1 },
    ];
    let mut sc = SchedulerConfig::new(layers, 16, ROWS * 1100 / 16 + 64).unwrap();
    sc.max_num_seqs = ROWS;
    sc.max_model_len = 1100;
    let engine = EngineHandle::start(
        LoopConfig {
            scheduler: sc,
            tokenizer: tok.clone(),
            eos_token_ids: vec![1],
            max_consecutive_failures: 1,
            // As served. The constrained runs are planned synchronously (no step is planned ahead
            // while a constrained sequence is live), so their ratio includes that.
            async_scheduling: true,
            kv_events: None,
        },
        Box::new(MockModel::new(vocab, 16, FORWARD)),
    )
    .unwrap();
    let mut rxs = Vec::new();
    for i in 0..ROWS {
        let prompt = tok
            .encode(format!("Row {i}: a list of numbers").as_str(), true)
            .unwrap();
        let p = GenParams {
            prompt: prompt.get_ids().to_vec(),
            max_tokens: 1000,
            ignore_eos: true,
            stream: true,
            skip_special_tokens: true,
            grammar: grammar.cloned(),
            ..Default::default()
        };
        rxs.push(engine.submit(p).unwrap().1);
    }
    let consumer = std::thread::spawn(move || {
        let mut live = rxs;
        while !live.is_empty() {
            live.retain_mut(|rx| loop {
                match rx.try_recv() {
                    Ok(Event::Finished(_)) => return false,
                    Ok(_) => {}
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => return true,
                    Err(_) => return false,
                }
            });
            std::thread::sleep(Duration::from_micros(500));
        }
    });
    // Skip the first 20 steps (prefill, cold lexer states), then a window of STEPS steps.
    let mut trace = Vec::new();
    let t = Instant::now();
    while trace.len() < 20 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(2));
        trace.extend(engine.stats().take_step_trace());
    }
    trace.clear();
    let cpu0 = thread_cpu_ns("yoco-step-loop").unwrap_or(0);
    while trace.len() < STEPS && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(2));
        trace.extend(engine.stats().take_step_trace());
    }
    let cpu1 = thread_cpu_ns("yoco-step-loop").unwrap_or(0);
    let steps = trace.len().max(1);
    engine.shutdown();
    let _ = consumer.join();
    trace.sort_unstable();
    let mean = trace.iter().map(|&x| x as f64).sum::<f64>() / steps as f64;
    let p50 = trace[(trace.len() - 1) / 2];
    (mean, p50, (cpu1 - cpu0) as f64 / 1e3 / steps as f64)
}

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/yoco_rs/default_model/tokenizer.json"
    );
    let tok = Tokenizer::from_file(path).expect("bundled tokenizer");
    let vocab = tok.get_vocab_size(true);
    let json = std::fs::read(path).unwrap();
    let compiler =
        GrammarCompiler::from_tokenizer_json(&json, vocab, &[1], CompileLimits::default()).unwrap();
    let schema = r#"{"type": "array", "items": {"type": "integer"}, "minItems": 10000,
                     "x-guidance": {"whitespace_flexible": false}}"#;
    let spec = GrammarSpec::parse(GrammarKind::JsonSchema, schema).unwrap();
    let grammar = Grammar {
        compiled: compiler.compile(&spec).unwrap(),
        vocab_size: compiler.vocab_size(),
    };
    let _keep: Arc<_> = grammar.compiled.clone();
    println!(
        "{ROWS} streams, {} ms mock forward, {STEPS}-step windows",
        FORWARD.as_millis()
    );
    println!("| run | constrained mean / p50 (µs) | unconstrained mean / p50 (µs) | ratio (mean) | loop CPU per step, constrained / unconstrained (µs) |");
    println!("|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for r in 0..REPS {
        let (cm, cp, cc) = run(&tok, Some(&grammar));
        let (um, up, uc) = run(&tok, None);
        ratios.push(cm / um);
        println!(
            "| {} | {cm:.0} / {cp} | {um:.0} / {up} | {:.3} | {cc:.0} / {uc:.0} |",
            r + 1,
            cm / um
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!("median ratio {:.3}", ratios[ratios.len() / 2]);
}
