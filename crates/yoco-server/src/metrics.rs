//! `GET /metrics`: Prometheus text with the Python server's names (vLLM's names under the
//! `yoco:` prefix, or `vllm:` with `--metrics-prefix vllm`; yoco's own series always `yoco:`),
//! labelled `model_name` and `engine` (the step loop's index with `--data-parallel-size`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::stats::Stats;

/// The exposition text of one scrape over the loops' figures (index = `engine` label).
pub fn render(prefix: &str, model: &str, loops: &[&Stats]) -> String {
    let model = escape(model);
    let labels: Vec<String> = (0..loops.len())
        .map(|i| format!("model_name=\"{model}\",engine=\"{i}\""))
        .collect();
    let mut o = String::with_capacity(4096 * loops.len());
    let gauges: [(&str, &str, fn(&Stats) -> f64); 3] = [
        (
            "num_requests_running",
            "Number of requests in model execution batches.",
            |s| s.running.load(Relaxed) as f64,
        ),
        (
            "num_requests_waiting",
            "Number of requests waiting to be processed.",
            |s| s.waiting.load(Relaxed) as f64,
        ),
        (
            "kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            |s| s.kv_usage_ppm.load(Relaxed) as f64 * 1e-6,
        ),
    ];
    for (name, help, get) in gauges {
        let _ = writeln!(
            o,
            "# HELP {prefix}:{name} {help}\n# TYPE {prefix}:{name} gauge"
        );
        for (l, s) in labels.iter().zip(loops) {
            let _ = writeln!(o, "{prefix}:{name}{{{l}}} {}", get(s));
        }
    }
    let counters: [(String, &str, fn(&Stats) -> &AtomicU64); 7] = [
        (
            format!("{prefix}:prefix_cache_queries"),
            "Prefix cache queries, in terms of number of queried tokens.",
            |s| &s.prefix_queries,
        ),
        (
            format!("{prefix}:prefix_cache_hits"),
            "Prefix cache hits, in terms of number of cached tokens.",
            |s| &s.prefix_hits,
        ),
        (
            format!("{prefix}:num_preemptions"),
            "Cumulative number of preemptions from the engine.",
            |s| &s.preemptions,
        ),
        (
            format!("{prefix}:prompt_tokens"),
            "Number of prefill tokens processed.",
            |s| &s.prompt_tokens,
        ),
        (
            format!("{prefix}:generation_tokens"),
            "Number of generation tokens processed.",
            |s| &s.generation_tokens,
        ),
        ("yoco:engine_steps".into(), "Engine steps run.", |s| {
            &s.steps
        }),
        (
            "yoco:engine_failed_steps".into(),
            "Engine steps whose executor call failed.",
            |s| &s.failed_steps,
        ),
    ];
    for (name, help, get) in counters {
        let _ = writeln!(o, "# HELP {name}_total {help}\n# TYPE {name}_total counter");
        for (l, s) in labels.iter().zip(loops) {
            let _ = writeln!(o, "{name}_total{{{l}}} {}", get(s).load(Relaxed));
        }
    }
    let name = format!("{prefix}:request_success");
    let _ = writeln!(o, "# HELP {name}_total Count of successfully processed requests.\n# TYPE {name}_total counter");
    for (l, s) in labels.iter().zip(loops) {
        for (i, reason) in ["stop", "length", "abort"].iter().enumerate() {
            let _ = writeln!(
                o,
                "{name}_total{{{l},finished_reason=\"{reason}\"}} {}",
                s.finished[i].load(Relaxed)
            );
        }
    }
    let name = "yoco:engine_step_period_seconds";
    let _ = writeln!(
        o,
        "# HELP {name} Time from the start of one engine step to the start of the next.\n\
                         # TYPE {name} histogram"
    );
    for (l, s) in labels.iter().zip(loops) {
        let (buckets, sum) = s.step_histogram();
        for (le, c) in &buckets {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                format!("{le:.6e}")
            };
            let _ = writeln!(o, "{name}_bucket{{{l},le=\"{le}\"}} {c}");
        }
        let total = buckets.last().map(|b| b.1).unwrap_or(0);
        let _ = writeln!(o, "{name}_sum{{{l}}} {sum}\n{name}_count{{{l}}} {total}");
    }
    o
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
