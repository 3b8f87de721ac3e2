"""GuideLLM against yoco-serve: TTFT and inter-token latency at several concurrencies, with fast prefill
and prefix caching switched on and off, on the bundled model; checks that GuideLLM's token counts
equal the server's (``yoco:prompt_tokens_total`` / ``yoco:generation_tokens_total`` deltas).

    benches/serve_guidellm.sh                      # all four configs, concurrency 1, 4, 16
    .venv/bin/python benches/serve_guidellm.py --levels 1,4 --requests 16 --configs fp+pc
    .venv/bin/python benches/serve_guidellm.py --configs fp+pc,async --rounds 2   # async scheduling on/off

Needs ``make setup`` (guidellm 0.8.1 is in the locked dev dependencies). Runs
offline: the tokenizer is the bundled model's directory. Prints a Markdown table (for RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIGS = {  # name -> yoco-serve flags (the FastAPI server of the earlier RESULTS tables is retired)
    "fp+pc": [],
    "fp": ["--no-enable-prefix-caching"],
    "pc": ["--no-kv-sharing-fast-prefill"],
    "none": ["--no-kv-sharing-fast-prefill", "--no-enable-prefix-caching"],
    # fp+pc with async scheduling forced on (on the CPU it is off by default: the forward is synchronous).
    "async": ["--async-scheduling"],
}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING"}


class Server:
    """A ``yoco-serve`` subprocess on a free port; the URL comes from its ready line."""

    def __init__(self, flags: list[str], threads: int):
        exe = os.path.join(os.path.dirname(sys.executable), "yoco-serve")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([exe, "--port", "0", "--disable-progress", *flags], stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True, env=env)
        self.url, self.ready_line, self.log = None, None, []
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                if line.startswith("yoco-serve ready:"):
                    self.ready_line = line.strip()
                    self.url = self.ready_line.rsplit(" ", 1)[-1]
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or self.url is None:
            self.stop()
            raise RuntimeError("yoco-serve did not start:\n" + "".join(self.log))

    def counters(self) -> dict:
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("yoco:") and "{" in line and not line.startswith("#"):
                name = line.split("{", 1)[0]
                if "finished_reason" in line:
                    continue
                out[name] = float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def tokenizer_dir() -> str:
    from yoco_rs.bundled import default_model_dir

    return default_model_dir()


def run_guidellm(url: str, out_json: str, *, levels: list[int], requests: int, prompt_tokens: int,
                 prefix_tokens: int, prefix_count: int, output_tokens: int, api: str) -> dict:
    data = {"kind": "synthetic_text", "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
            "prefix_buckets": [{"prefix_count": prefix_count, "prefix_tokens": prefix_tokens}]}
    cmd = [sys.executable, "-m", "guidellm", "run",
           "--backend", f"kind=openai_http,target={url},model=yoco-tiny,request_format={api}",
           "--profile", f"kind=concurrent,streams={levels[0]}",
           "--data", json.dumps(data),
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir()}",
           "--constraint", f"kind=max_requests,count={requests}",
           "--output", f"kind=json,path={out_json}", "--disable-console"]
    if len(levels) > 1:
        cmd += ["--override", "profile.streams", ",".join(map(str, levels))]
    r = subprocess.run(cmd, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"guidellm failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    with open(out_json) as f:
        return json.load(f)


def summarize(report: dict) -> list[dict]:
    rows = []
    for b in report["benchmarks"]:
        m = b["metrics"]

        def stat(key, field, sub="successful"):
            s = m[key][sub]
            return s["percentiles"][field] if field in s.get("percentiles", {}) else s[field]

        rows.append(dict(
            concurrency=b["config"]["strategy"]["streams"],
            ok=m["request_totals"]["successful"], errored=m["request_totals"]["errored"],
            incomplete=m["request_totals"]["incomplete"],
            ttft_p50=stat("time_to_first_token_ms", "p50"), ttft_p95=stat("time_to_first_token_ms", "p95"),
            itl_mean=stat("inter_token_latency_ms", "mean"), itl_p50=stat("inter_token_latency_ms", "p50"),
            out_tps=m["output_tokens_per_second"]["successful"]["mean"],
            prompt_tokens=m["prompt_token_count"]["total"]["total_sum"],
            output_tokens=m["output_token_count"]["total"]["total_sum"],
        ))
    return rows


def run_config(name: str, rnd: int, levels: list[int], args, json_dir: str) -> dict:
    srv = Server(["--max-model-len", "2048", *CONFIGS[name]], args.server_threads)
    try:
        before = srv.counters()
        t0 = time.monotonic()
        report = run_guidellm(srv.url, os.path.join(json_dir, f"{name}-{rnd}.json"), levels=levels,
                              requests=args.requests, prompt_tokens=args.prompt_tokens,
                              prefix_tokens=args.prefix_tokens, prefix_count=args.prefix_count,
                              output_tokens=args.output_tokens, api=args.api)
        wall = time.monotonic() - t0
        after = srv.counters()
    finally:
        srv.stop()
    rows = summarize(report)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    gl = (sum(r["prompt_tokens"] for r in rows), sum(r["output_tokens"] for r in rows))
    srv_counts = (d["yoco:prompt_tokens_total"], d["yoco:generation_tokens_total"])
    return dict(rows=rows, wall=wall, gl=gl, srv=srv_counts,
                match=round(gl[0]) == srv_counts[0] and round(gl[1]) == srv_counts[1],
                hit=d["yoco:prefix_cache_hits_total"] / max(d["yoco:prefix_cache_queries_total"], 1),
                cross=d.get("yoco:cross_decoder_rows_total", float("nan")) / max(d.get("yoco:scheduled_tokens_total", 0), 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="fp+pc,fp,pc,none", help=f"comma list of {sorted(CONFIGS)}")
    ap.add_argument("--levels", default="1,4,16", help="concurrency levels (GuideLLM concurrent streams)")
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="unique prompt tokens per request")
    ap.add_argument("--prefix-tokens", type=int, default=384, help="shared prefix tokens")
    ap.add_argument("--prefix-count", type=int, default=2, help="distinct shared prefixes")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--api", default="/v1/completions", choices=("/v1/completions", "/v1/chat/completions"))
    ap.add_argument("--server-threads", type=int, default=1, help="OMP_NUM_THREADS of the server")
    ap.add_argument("--json-dir", default=None, help="keep GuideLLM's JSON reports here")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the configs this many times, alternating their order (ABCD DCBA ...); the table "
                         "shows the median per config and concurrency (the box is shared and noisy)")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    names = args.configs.split(",")
    runs: dict[str, list] = {n: [] for n in names}
    mismatches = []
    json_dir = args.json_dir or tempfile.mkdtemp(prefix="yoco-guidellm-")
    for rnd in range(args.rounds):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            res = run_config(name, rnd, levels, args, json_dir)
            runs[name].append(res)
            if not res["match"]:
                mismatches.append(name)
            print(f"[{name} round {rnd}] done in {res['wall']:.0f} s; tokens GuideLLM {res['gl'][0]:.0f}/"
                  f"{res['gl'][1]:.0f} vs server {res['srv'][0]:.0f}/{res['srv'][1]:.0f} "
                  f"({'match' if res['match'] else 'MISMATCH'})", file=sys.stderr)

    def med(name, level, key):
        return statistics.median(r[key] for res in runs[name] for r in res["rows"] if r["concurrency"] == level)

    print(f"\nWorkload: GuideLLM 0.8.1 concurrent profile, {args.requests} requests per level, synthetic text with "
          f"{args.prefix_count} shared prefixes of {args.prefix_tokens} tokens + {args.prompt_tokens} unique prompt "
          f"tokens, {args.output_tokens} output tokens (ignore_eos), {args.api}; {args.rounds} round(s), medians. "
          f"Configs: fp = fast prefill (--kv-sharing-fast-prefill), pc = prefix caching; async = fp+pc with "
          f"--async-scheduling (on the CPU it schedules synchronously by default).\n")
    print("| config | concurrency | TTFT p50 ms | TTFT p95 ms | ITL mean ms | ITL p50 ms | output tok/s | "
          "prefix hit rate | cross rows / scheduled | GuideLLM tokens = server's |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        last = runs[name][-1]
        for lv in levels:
            print(f"| {name} | {lv} | {med(name, lv, 'ttft_p50'):.1f} | {med(name, lv, 'ttft_p95'):.1f} | "
                  f"{med(name, lv, 'itl_mean'):.2f} | {med(name, lv, 'itl_p50'):.2f} | {med(name, lv, 'out_tps'):.0f} | "
                  f"{last['hit']:.2f} | {last['cross']:.3f} | "
                  f"{'yes' if all(r['match'] for r in runs[name]) else 'NO'} ({last['gl'][0]:.0f}/{last['gl'][1]:.0f}) |")
    if "none" in names:
        print("\nTTFT p50 relative to `none` (same run; lower is better):\n")
        print("| concurrency | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for lv in levels:
            base = med("none", lv, "ttft_p50")
            print(f"| {lv} | " + " | ".join(f"{med(n, lv, 'ttft_p50') / base:.2f}" for n in names) + " |")
    if "fp+pc" in names and "async" in names:
        print("\nAsync scheduling relative to synchronous (`async` / `fp+pc`, same run; TTFT p50, ITL mean, "
              "output tok/s):\n")
        print("| concurrency | TTFT / ITL / tok/s |")
        print("|---|---|")
        for lv in levels:
            ratios = [med("async", lv, k) / med("fp+pc", lv, k) for k in ("ttft_p50", "itl_mean", "out_tps")]
            print(f"| {lv} | " + " / ".join(f"{x:.2f}" for x in ratios) + " |")
    if mismatches:
        print(f"token counts differ for: {mismatches}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
