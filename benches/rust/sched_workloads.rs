//! Scheduler CPU cost per engine step over the shared `peer-bench-workload/1` workloads, measured
//! the way the vLLM / nano-vllm figures in `/work/shared/bench/README.md` were: per step, the thread
//! CPU time of `schedule()` + `update()` with a mock executor whose own time is not counted;
//! admission (`add_request`, which hashes the prompt) reported separately.
//!
//! ```text
//! cargo bench -p yoco-core --bench sched_workloads -- [WORKLOAD ...] [--dir DIR] [--layout full|gemma3n]
//!     [--no-prefix-caching] [--repeat N] [--json FILE]
//! ```
//! Workloads default to all files in `benches/workloads/` (copies of `/work/shared/bench/workloads`).
//! `--layout gemma3n` uses Gemma 3n E2B's 30 layers (2 KV groups: sliding 512 + full) instead of one
//! full-attention group (what the peers model).

#[path = "cpu_time.rs"]
mod cpu_time;
#[path = "workload.rs"]
mod workload;

use std::path::PathBuf;

use cpu_time::thread_ns;
use workload::{Workload, EOS_TOKEN, FIRST_TOKEN};
use yoco_core::kv::LayerKind;
use yoco_core::mock::MockExecutor;
use yoco_core::sched::{NewRequest, Scheduler, SchedulerConfig};

/// mean / p50 / p99 (nearest rank) in µs, total in s.
#[derive(Debug, Clone, Copy, Default)]
struct Summary {
    n: usize,
    mean: f64,
    p50: f64,
    p99: f64,
    total_s: f64,
}

fn summarize(ns: &[u64]) -> Summary {
    if ns.is_empty() {
        return Summary::default();
    }
    let mut s = ns.to_vec();
    s.sort_unstable();
    let n = s.len();
    let pct = |p: f64| s[((p / 100.0 * n as f64).ceil() as usize).max(1) - 1] as f64 / 1e3;
    let total: u64 = s.iter().sum();
    Summary {
        n,
        mean: total as f64 / n as f64 / 1e3,
        p50: pct(50.0),
        p99: pct(99.0),
        total_s: total as f64 / 1e9,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Full,
    Gemma3n,
}

fn layers(layout: Layout) -> Vec<LayerKind> {
    match layout {
        Layout::Full => vec![LayerKind::Full],
        Layout::Gemma3n => {
            // E2B: 30 layers, 4 of every 5 sliding (window 512), the last 10 share KV with the last
            // sliding (18) and full (19) layers before them.
            (0..30)
                .map(|i| {
                    let full = i % 5 == 4;
                    if i < 20 {
                        if full {
                            LayerKind::Full
                        } else {
                            LayerKind::Sliding { window: 512 }
                        }
                    } else {
                        LayerKind::SharesKv {
                            donor: if full { 19 } else { 18 },
                        }
                    }
                })
                .collect()
        }
    }
}

struct Report {
    name: String,
    requests: usize,
    steps: usize,
    idle_steps_skipped: u64,
    tokens_scheduled: u64,
    cached_tokens: u64,
    step: Summary,
    schedule: Summary,
    update: Summary,
    decode_full: Summary,
    admit_us: f64,
}

fn run(w: &Workload, layout: Layout, prefix_caching: bool) -> Report {
    let bs = w.block_size.unwrap_or(16);
    let max_num_seqs = w.max_num_seqs.unwrap_or(256);
    let mut c = SchedulerConfig::new(layers(layout), bs, w.num_blocks(bs)).unwrap();
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = w.max_num_batched_tokens.unwrap_or(8192);
    c.max_model_len = w.max_seq_len().next_multiple_of(bs);
    c.kv.enable_prefix_caching = prefix_caching;
    let mut s = Scheduler::new(c).unwrap();
    let mut mock = MockExecutor::new(w.vocab_size).first_token(FIRST_TOKEN);

    let mut step_ns = Vec::new();
    let mut sched_ns = Vec::new();
    let mut update_ns = Vec::new();
    let mut decode_full_ns = Vec::new();
    let mut admit_ns = 0u64;
    let mut produced = vec![0u32; w.requests.len()];
    let (mut tokens, mut cached) = (0u64, 0u64);
    let mut next = 0;
    let mut step: u64 = 0;
    let mut idle_skipped = 0;
    while next < w.requests.len() || s.num_unfinished() > 0 {
        if s.num_unfinished() == 0 && w.requests[next].arrival_step > step {
            idle_skipped += w.requests[next].arrival_step - step;
            step = w.requests[next].arrival_step;
        }
        while next < w.requests.len() && w.requests[next].arrival_step <= step {
            let r = &w.requests[next];
            let req = NewRequest {
                id: r.index as u64,
                prompt: r.prompt.clone(),
                max_tokens: r.max_tokens,
                eos_token_ids: vec![EOS_TOKEN],
                ..Default::default()
            };
            let t0 = thread_ns();
            s.add_request(req).unwrap();
            admit_ns += thread_ns() - t0;
            next += 1;
        }
        let t0 = thread_ns();
        s.schedule();
        let t1 = thread_ns();
        let plan = s.plan();
        let sampled = mock.sample(plan, &[]).to_vec();
        let decode_full = plan.max_query_len == 1 && plan.num_rows() == max_num_seqs as usize;
        tokens += plan.num_tokens as u64;
        cached += plan
            .admitted_num_cached
            .iter()
            .map(|&x| x as u64)
            .sum::<u64>();
        let t2 = thread_ns();
        let out = s.update(&sampled).unwrap();
        let t3 = thread_ns();
        for &id in &out.req_ids {
            produced[id as usize] += 1;
        }
        let (a, b) = (t1 - t0, t3 - t2);
        sched_ns.push(a);
        update_ns.push(b);
        step_ns.push(a + b);
        if decode_full {
            decode_full_ns.push(a + b);
        }
        step += 1;
    }
    for (j, r) in w.requests.iter().enumerate() {
        assert_eq!(
            produced[j], r.max_tokens,
            "{}: request {} produced {} of {} tokens",
            w.name, r.id, produced[j], r.max_tokens
        );
    }
    Report {
        name: w.name.clone(),
        requests: w.requests.len(),
        steps: step_ns.len(),
        idle_steps_skipped: idle_skipped,
        tokens_scheduled: tokens,
        cached_tokens: cached,
        step: summarize(&step_ns),
        schedule: summarize(&sched_ns),
        update: summarize(&update_ns),
        decode_full: summarize(&decode_full_ns),
        admit_us: admit_ns as f64 / w.requests.len() as f64 / 1e3,
    }
}

fn median_by<F: Fn(&Report) -> f64>(runs: Vec<Report>, key: F) -> Report {
    let mut runs = runs;
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = runs.len() / 2;
    runs.swap_remove(mid)
}

fn main() {
    let mut names = Vec::new();
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../benches/workloads");
    let mut layout = Layout::Full;
    let mut prefix_caching = true;
    let mut repeat = 3;
    let mut json = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--dir" => dir = PathBuf::from(args.next().expect("--dir DIR")),
            "--layout" => {
                layout = match args.next().as_deref() {
                    Some("full") => Layout::Full,
                    Some("gemma3n") => Layout::Gemma3n,
                    other => panic!("--layout full|gemma3n, got {other:?}"),
                }
            }
            "--no-prefix-caching" => prefix_caching = false,
            "--repeat" => {
                repeat = args
                    .next()
                    .and_then(|x| x.parse().ok())
                    .expect("--repeat N")
            }
            "--json" => json = Some(PathBuf::from(args.next().expect("--json FILE"))),
            x if x.starts_with("--") => {}
            x => names.push(x.to_string()),
        }
    }
    if names.is_empty() {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        names = files
            .iter()
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
    }
    println!(
        "layout={layout:?} prefix_caching={prefix_caching} repeat={repeat} (median by step mean); µs of thread CPU per step"
    );
    println!("| workload | steps | tokens scheduled | prefix-cached tokens | step mean | step p50 | step p99 | schedule mean | update mean | step total (s) | admit µs/req | step CPU µs / sched. token | decode-full steps mean / p50 / p99 (µs per running req) |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let mut json_rows = Vec::new();
    for name in &names {
        let w = workload::load(&dir.join(format!("{name}.json"))).unwrap();
        let _warm = run(&w, layout, prefix_caching);
        let runs: Vec<Report> = (0..repeat)
            .map(|_| run(&w, layout, prefix_caching))
            .collect();
        let r = median_by(runs, |r| r.step.mean);
        let n = w.max_num_seqs.unwrap_or(256) as f64;
        let dec = if r.decode_full.n > 0 {
            format!(
                "{:.1} / {:.1} / {:.1} ({:.3})",
                r.decode_full.mean,
                r.decode_full.p50,
                r.decode_full.p99,
                r.decode_full.mean / n
            )
        } else {
            "–".into()
        };
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.4} | {:.1} | {:.4} | {} |",
            r.name,
            r.steps,
            r.tokens_scheduled,
            r.cached_tokens,
            r.step.mean,
            r.step.p50,
            r.step.p99,
            r.schedule.mean,
            r.update.mean,
            r.step.total_s,
            r.admit_us,
            r.step.total_s * 1e6 / r.tokens_scheduled as f64,
            dec
        );
        json_rows.push(format!(
            "{{\"workload\":\"{}\",\"layout\":\"{:?}\",\"prefix_caching\":{},\"requests\":{},\"steps\":{},\"idle_steps_skipped\":{},\"tokens_scheduled\":{},\"prefix_cached_tokens\":{},\"step_mean_us\":{:.2},\"step_p50_us\":{:.2},\"step_p99_us\":{:.2},\"schedule_mean_us\":{:.2},\"update_mean_us\":{:.2},\"step_total_s\":{:.4},\"admit_us_per_req\":{:.2},\"decode_full_steps\":{},\"decode_full_mean_us\":{:.2},\"decode_full_p50_us\":{:.2},\"decode_full_p99_us\":{:.2}}}",
            r.name, layout, prefix_caching, r.requests, r.steps, r.idle_steps_skipped, r.tokens_scheduled, r.cached_tokens,
            r.step.mean, r.step.p50, r.step.p99, r.schedule.mean, r.update.mean, r.step.total_s, r.admit_us,
            r.decode_full.n, r.decode_full.mean, r.decode_full.p50, r.decode_full.p99
        ));
    }
    if let Some(path) = json {
        std::fs::write(&path, format!("[\n{}\n]\n", json_rows.join(",\n"))).unwrap();
    }
}
