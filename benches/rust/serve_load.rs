//! A small streaming load client for the serving benchmarks: `C` concurrent `/v1/completions`
//! (or, with `--chat`, `/v1/chat/completions`) streams of `T` tokens each against any OpenAI-compatible server, on one thread (so its CPU share
//! is easy to read off), printing one JSON line:
//! `{"streams", "tokens", "wall_s", "tokens_per_s", "ttft_p50_ms", "ttft_p95_ms", "steps",
//!   "step_mean_ms", "client_cpu_s", "client_cpu_share", "errors"}`.
//!
//! ```text
//! cargo bench -p yoco-server --bench serve_load -- --url http://127.0.0.1:8000 \
//!     --concurrency 256 --max-tokens 256 [--requests N] [--model NAME] [--chat]
//! ```
//! `--requests` (default = concurrency) requests are sent, at most `--concurrency` at once. `tokens`
//! sums the servers' own `usage.completion_tokens`; `steps` is the delta of the server's
//! `yoco:engine_steps_total` over the run.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

struct Args {
    url: String,
    concurrency: usize,
    requests: usize,
    max_tokens: usize,
    model: Option<String>,
    /// Chat completions instead of completions.
    chat: bool,
}

fn args() -> Args {
    let mut a = Args {
        url: "http://127.0.0.1:8000".into(),
        concurrency: 64,
        requests: 0,
        max_tokens: 256,
        model: None,
        chat: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(f) = it.next() {
        match f.as_str() {
            "--url" => a.url = it.next().unwrap(),
            "--concurrency" => a.concurrency = it.next().unwrap().parse().unwrap(),
            "--requests" => a.requests = it.next().unwrap().parse().unwrap(),
            "--max-tokens" => a.max_tokens = it.next().unwrap().parse().unwrap(),
            "--model" => a.model = Some(it.next().unwrap()),
            "--chat" => a.chat = true,
            _ => {} // cargo bench passes `--bench`
        }
    }
    if a.requests == 0 {
        a.requests = a.concurrency;
    }
    a
}

/// This process's CPU time (user + system), from /proc.
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

async fn get_text(c: &HttpClient, url: &str) -> String {
    let req = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    match c.request(req).await {
        Ok(r) => String::from_utf8_lossy(
            &r.into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default(),
        )
        .into_owned(),
        Err(_) => String::new(),
    }
}

async fn steps(c: &HttpClient, base: &str) -> f64 {
    let m = get_text(c, &format!("{base}/metrics")).await;
    m.lines()
        .find(|l| l.starts_with("yoco:engine_steps_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Whether `data` carries generated text: a completion chunk's `"text":"`, or a chat chunk's
/// non-empty `"content":"...` (the role chunk's content is empty).
fn has_text(data: &[u8], chat: bool) -> bool {
    if !chat {
        return data.windows(8).any(|w| w == b"\"text\":\"");
    }
    const KEY: &[u8] = b"\"content\":\"";
    data.windows(KEY.len())
        .enumerate()
        .any(|(i, w)| w == KEY && data.get(i + KEY.len()).is_some_and(|&b| b != b'"'))
}

/// One streamed request: (time to first token, completion tokens) or an error.
async fn one(
    c: HttpClient,
    url: String,
    body: String,
    chat: bool,
) -> Result<(Duration, u64), String> {
    let t0 = Instant::now();
    let req = Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = c.request(req).await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let mut body = resp.into_body();
    let mut ttft = None;
    let mut buf: Vec<u8> = Vec::new();
    let mut tokens = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        if ttft.is_none() && has_text(data, chat) {
            ttft = Some(t0.elapsed());
        }
        buf.extend_from_slice(data);
        // Keep only the tail that may hold the final usage chunk.
        if buf.len() > 1 << 16 {
            buf.drain(..buf.len() - 4096);
        }
    }
    let s = String::from_utf8_lossy(&buf);
    if let Some(i) = s.rfind("\"completion_tokens\":") {
        let rest = &s[i + 20..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        tokens = rest[..end].parse().unwrap_or(0);
    }
    Ok((ttft.unwrap_or_else(|| t0.elapsed()), tokens))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let c: HttpClient = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(a.concurrency)
            .build_http();
        let base = a.url.trim_end_matches('/').to_string();
        let url = if a.chat {
            format!("{base}/v1/chat/completions")
        } else {
            format!("{base}/v1/completions")
        };
        let model = a.model.as_ref().map(|m| format!("\"model\":\"{m}\",")).unwrap_or_default();
        let s0 = steps(&c, &base).await;
        let cpu0 = cpu_seconds();
        let t0 = Instant::now();
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(a.concurrency));
        let mut tasks = Vec::with_capacity(a.requests);
        for i in 0..a.requests {
            let input = if a.chat {
                format!("\"messages\":[{{\"role\":\"user\",\"content\":\"Request {i}: tell me a story about the sea\"}}]")
            } else {
                format!("\"prompt\":\"Request {i}: tell me a story about the sea\"")
            };
            let body = format!(
                "{{{model}{input},\"max_tokens\":{},\
                 \"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}",
                a.max_tokens
            );
            let (c, url, sem, chat) = (c.clone(), url.clone(), sem.clone(), a.chat);
            tasks.push(tokio::spawn(async move {
                let _p = sem.acquire_owned().await.unwrap();
                one(c, url, body, chat).await
            }));
        }
        let mut ttfts = Vec::new();
        let mut tokens = 0u64;
        let mut errors = 0usize;
        for t in tasks {
            match t.await.unwrap() {
                Ok((ttft, n)) => {
                    ttfts.push(ttft.as_secs_f64() * 1e3);
                    tokens += n;
                }
                Err(_) => errors += 1,
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        let s1 = steps(&c, &base).await;
        let nsteps = s1 - s0;
        println!(
            "{{\"streams\":{},\"requests\":{},\"tokens\":{tokens},\"wall_s\":{wall:.4},\"tokens_per_s\":{:.1},\
             \"ttft_p50_ms\":{:.2},\"ttft_p95_ms\":{:.2},\"steps\":{nsteps},\"step_mean_ms\":{:.4},\
             \"client_cpu_s\":{cpu:.3},\"client_cpu_share\":{:.3},\"errors\":{errors}}}",
            a.concurrency, a.requests, tokens as f64 / wall, pct(&mut ttfts.clone(), 0.5), pct(&mut ttfts, 0.95),
            wall * 1e3 / nsteps, cpu / wall
        );
    });
}
