//! `GET /metrics`: Prometheus text with the Python server's names (vLLM's names under the
//! `yoco:` prefix, or `vllm:` with `--metrics-prefix vllm`; yoco's own series always `yoco:`),
//! labelled `model_name` and `engine`.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use crate::stats::Stats;

/// The exposition text of one scrape.
pub fn render(prefix: &str, model: &str, s: &Stats) -> String {
    let l = format!("model_name=\"{}\",engine=\"0\"", escape(model));
    let mut o = String::with_capacity(4096);
    let gauge = |o: &mut String, name: &str, help: &str, v: f64| {
        let _ = writeln!(
            o,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {v}"
        );
    };
    gauge(
        &mut o,
        &format!("{prefix}:num_requests_running"),
        "Number of requests in model execution batches.",
        s.running.load(Relaxed) as f64,
    );
    gauge(
        &mut o,
        &format!("{prefix}:num_requests_waiting"),
        "Number of requests waiting to be processed.",
        s.waiting.load(Relaxed) as f64,
    );
    gauge(
        &mut o,
        &format!("{prefix}:kv_cache_usage_perc"),
        "KV-cache usage. 1 means 100 percent usage.",
        s.kv_usage_ppm.load(Relaxed) as f64 * 1e-6,
    );
    let counters = [
        (
            format!("{prefix}:prefix_cache_queries"),
            "Prefix cache queries, in terms of number of queried tokens.",
            &s.prefix_queries,
        ),
        (
            format!("{prefix}:prefix_cache_hits"),
            "Prefix cache hits, in terms of number of cached tokens.",
            &s.prefix_hits,
        ),
        (
            format!("{prefix}:num_preemptions"),
            "Cumulative number of preemptions from the engine.",
            &s.preemptions,
        ),
        (
            format!("{prefix}:prompt_tokens"),
            "Number of prefill tokens processed.",
            &s.prompt_tokens,
        ),
        (
            format!("{prefix}:generation_tokens"),
            "Number of generation tokens processed.",
            &s.generation_tokens,
        ),
        (
            "yoco:engine_steps".to_string(),
            "Engine steps run.",
            &s.steps,
        ),
        (
            "yoco:engine_failed_steps".to_string(),
            "Engine steps whose executor call failed.",
            &s.failed_steps,
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(
            o,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{l}}} {}",
            v.load(Relaxed)
        );
    }
    let name = format!("{prefix}:request_success");
    let _ = writeln!(o, "# HELP {name}_total Count of successfully processed requests.\n# TYPE {name}_total counter");
    for (i, reason) in ["stop", "length", "abort"].iter().enumerate() {
        let _ = writeln!(
            o,
            "{name}_total{{{l},finished_reason=\"{reason}\"}} {}",
            s.finished[i].load(Relaxed)
        );
    }
    let (buckets, sum) = s.step_histogram();
    let name = "yoco:engine_step_period_seconds";
    let _ = writeln!(
        o,
        "# HELP {name} Time from the start of one engine step to the start of the next.\n\
                         # TYPE {name} histogram"
    );
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
    o
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
