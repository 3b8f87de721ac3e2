//! `GET /metrics`: Prometheus text with the Python server's names (vLLM's names under the
//! `yoco:` prefix, or `vllm:` with `--metrics-prefix vllm`; yoco's own series always `yoco:`),
//! labelled `model_name` and `engine` (the step loop's index with `--data-parallel-size`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::app::AppConfig;
use crate::front_metrics::FrontMetrics;
use crate::hist::Hist;
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

/// `le` as Prometheus' Go client (and Python's `floatToGoString`) writes it: `0.001`, `1.0`,
/// `100000.0`, `1e+06`, `+Inf`.
fn go_float(d: f64) -> String {
    if d.is_infinite() {
        return if d > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let s = crate::pyjson::float_repr(d);
    match s.find('.') {
        Some(dot) if d > 0.0 && dot > 6 => {
            let mantissa = format!("{}.{}", &s[..1], &s[1..dot]);
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => s,
    }
}

fn histogram(o: &mut String, name: &str, help: &str, series: &[(&str, &Hist)]) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (l, h) in series {
        let (buckets, sum) = h.cumulative();
        for (le, c) in &buckets {
            let _ = writeln!(o, "{name}_bucket{{{l},le=\"{}\"}} {c}", go_float(*le));
        }
        let total = buckets.last().map(|b| b.1).unwrap_or(0);
        let _ = writeln!(o, "{name}_count{{{l}}} {total}\n{name}_sum{{{l}}} {sum}");
    }
}

fn per_loop(o: &mut String, name: &str, kind: &str, help: &str, labels: &[String], v: &[u64]) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (l, x) in labels.iter().zip(v) {
        let _ = writeln!(o, "{name}{{{l}}} {x}");
    }
}

/// The series of the Python server that [`render`] does not write: vLLM's request histograms,
/// `cache_config_info`, yoco's KV counters and gauges, the request-parameter histograms,
/// `http_requests_total`, and the deprecated names under `--compat-metric-names`.
pub(crate) fn render_parity(
    o: &mut String,
    cfg: &AppConfig,
    loops: &[&Stats],
    front: &FrontMetrics,
) {
    let prefix = &cfg.metrics_prefix;
    let model = escape(&cfg.served_model_names[0]);
    let labels: Vec<String> = (0..loops.len())
        .map(|i| format!("model_name=\"{model}\",engine=\"{i}\""))
        .collect();
    if cfg.compat_metric_names {
        let _ = writeln!(
            o,
            "# HELP {prefix}:gpu_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
             # TYPE {prefix}:gpu_cache_usage_perc gauge"
        );
        for (l, s) in labels.iter().zip(loops) {
            let v = s.kv_usage_ppm.load(Relaxed) as f64 * 1e-6;
            let _ = writeln!(o, "{prefix}:gpu_cache_usage_perc{{{l}}} {v}");
        }
        let q: Vec<u64> = loops
            .iter()
            .map(|s| s.prefix_queries.load(Relaxed))
            .collect();
        let h: Vec<u64> = loops.iter().map(|s| s.prefix_hits.load(Relaxed)).collect();
        per_loop(
            o,
            &format!("{prefix}:gpu_prefix_cache_queries_total"),
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            &labels,
            &q,
        );
        per_loop(
            o,
            &format!("{prefix}:gpu_prefix_cache_hits_total"),
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            &labels,
            &h,
        );
    }
    let name = format!("{prefix}:cache_config_info");
    let _ = writeln!(
        o,
        "# HELP {name} Information of the LLMEngine CacheConfig\n# TYPE {name} gauge"
    );
    let info: String = cfg
        .cache_config_info
        .iter()
        .map(|(k, v)| format!(",{k}=\"{}\"", escape(v)))
        .collect();
    for l in &labels {
        let _ = writeln!(o, "{name}{{{l}{info}}} 1.0");
    }
    type Pick = fn(&Stats) -> &Hist;
    let hists: [(&str, &str, Pick, Option<&str>); 9] = [
        (
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            |s| &s.hists.ttft,
            None,
        ),
        (
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            |s| &s.hists.itl,
            Some("time_per_output_token_seconds"),
        ),
        (
            "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            |s| &s.hists.e2e,
            None,
        ),
        (
            "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            |s| &s.hists.queue,
            None,
        ),
        (
            "request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            |s| &s.hists.prefill,
            None,
        ),
        (
            "request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            |s| &s.hists.decode,
            None,
        ),
        (
            "request_prompt_tokens",
            "Number of prefill tokens processed.",
            |s| &s.hists.prompt_tokens,
            None,
        ),
        (
            "request_generation_tokens",
            "Number of generation tokens processed.",
            |s| &s.hists.generation_tokens,
            None,
        ),
        (
            "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            |s| &s.hists.iteration_tokens,
            None,
        ),
    ];
    for (name, help, pick, alias) in hists {
        let series: Vec<(&str, &Hist)> = labels
            .iter()
            .zip(loops)
            .map(|(l, s)| (l.as_str(), pick(s)))
            .collect();
        histogram(o, &format!("{prefix}:{name}"), help, &series);
        if let (Some(a), true) = (alias, cfg.compat_metric_names) {
            histogram(o, &format!("{prefix}:{a}"), help, &series);
        }
    }
    type Count = fn(&Stats) -> u64;
    let cross: Count = if cfg.kv_sharing_fast_prefill {
        |s| s.cross_rows.load(Relaxed)
    } else {
        |s| s.scheduled_tokens.load(Relaxed)
    };
    let counters: [(&str, &str, Count); 7] = [
        ("scheduled_tokens", "Tokens run through the self-decoder (every scheduled token).",
         |s| s.scheduled_tokens.load(Relaxed)),
        ("cross_decoder_rows",
         "Rows run through the cross-decoder (only rows whose logits are needed with fast prefill).",
         cross),
        ("kv_sub_block_copies", "Sub-block prefix-cache hits served by copying KV into a fresh block.",
         |s| s.kv.copies.load(Relaxed)),
        ("kv_sub_block_copied_tokens", "Tokens of KV copied by sub-block prefix-cache hits.",
         |s| s.kv.copied_tokens.load(Relaxed)),
        ("kv_block_adoptions", "Partial cached blocks adopted in place instead of copied.",
         |s| s.kv.adoptions.load(Relaxed)),
        ("kv_events_published", "KV event batches published (--kv-events-config).",
         |s| s.kv_events_published.load(Relaxed)),
        ("kv_events_dropped",
         "KV event batches dropped on a full publisher queue, plus events the bounded log discarded.",
         |s| s.kv_events_dropped.load(Relaxed)),
    ];
    for (name, help, get) in counters {
        let v: Vec<u64> = loops.iter().map(|s| get(s)).collect();
        per_loop(
            o,
            &format!("yoco:{name}_total"),
            "counter",
            help,
            &labels,
            &v,
        );
    }
    let gauges: [(&str, &str, Count); 4] = [
        ("kv_blocks_total", "Usable KV blocks per group.", |s| {
            s.kv.blocks_total.load(Relaxed)
        }),
        (
            "kv_blocks_used",
            "KV blocks referenced by requests (0 when idle: nothing leaked).",
            |s| s.kv.blocks_used.load(Relaxed),
        ),
        (
            "kv_blocks_free",
            "KV blocks on the free list (cached or empty).",
            |s| s.kv.blocks_free.load(Relaxed),
        ),
        (
            "kv_blocks_cached",
            "Free KV blocks that still hold a cached prefix.",
            |s| s.kv.blocks_cached.load(Relaxed),
        ),
    ];
    for (name, help, get) in gauges {
        let v: Vec<u64> = loops.iter().map(|s| get(s)).collect();
        per_loop(o, &format!("yoco:{name}"), "gauge", help, &labels, &v);
    }
    let front_label = format!("model_name=\"{model}\",engine=\"0\"");
    histogram(
        o,
        &format!("{prefix}:request_params_n"),
        "Histogram of the n request parameter.",
        &[(front_label.as_str(), &front.params_n)],
    );
    histogram(
        o,
        &format!("{prefix}:request_params_max_tokens"),
        "Histogram of the max_tokens request parameter.",
        &[(front_label.as_str(), &front.params_max_tokens)],
    );
    let _ = writeln!(
        o,
        "# HELP http_requests_total Total number of requests by method, status and handler.\n\
         # TYPE http_requests_total counter"
    );
    for ((m, st, h), c) in front.http.lock().unwrap().iter() {
        let _ = writeln!(
            o,
            "http_requests_total{{method=\"{}\",status=\"{st}\",handler=\"{}\"}} {c}",
            escape(m),
            escape(h)
        );
    }
}
