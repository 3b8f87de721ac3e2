"""The serving path's ceiling: the Rust front end + step loop (``yoco-server``) over a zero-cost executor,
measured by a Rust load client (``benches/rust/serve_load.rs``, one thread; its CPU share is reported).
(The FastAPI server these figures were first measured against is retired; its figures stay in RESULTS.md.)

1. Ceiling: 1 / 64 / 256 concurrent streams x 256 tokens (one burst): streamed tokens/s, TTFT
   p50/p95 of the burst, mean step period.
2. Overlap: a forward of 5 ms (slept outside the loop thread / outside the GIL), 256 streams: steps
   per second against the ideal 200 (the Rust loop's median step period from its step trace), and
   the loop's time from a step's collect to the next launch (what a device waits for; its step trace
   too) and the loop thread's CPU per step (`/proc/PID/task/TID/schedstat`, load-independent).
3. Jitter: 256 streams served while new requests keep arriving (768 requests, 256 at a time):
   step period p50 / p99 from the step trace (zero-cost and 5 ms forward).

The Rust server runs with async scheduling (its default) and, in the same run, with
``--no-async-scheduling`` (``--rust-modes`` picks).

    .venv/bin/python benches/serve_ceiling.py [--quick] [--rust-modes async,sync]

Prints a Markdown table (paste into benches/RESULTS.md with the date and the machine's load).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "python", "yoco_rs", "default_model", "tokenizer.json")


def build() -> tuple[str, str]:
    subprocess.run(["cargo", "build", "--locked", "--release", "-p", "yoco-server", "--bin", "yoco_mock_server",
                    "--bench", "serve_load"], cwd=ROOT, check=True)
    out = subprocess.run(["cargo", "bench", "--locked", "-p", "yoco-server", "--bench", "serve_load", "--no-run",
                          "--message-format", "json"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    client = None
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "serve_load" \
                and msg.get("executable"):
            client = msg["executable"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release", "yoco_mock_server"), client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc, timeout: float = 120.0) -> None:
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError("server did not become ready")


class Server:
    def __init__(self, kind: str, mock_bin: str, forward_ms: float):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        common = ["--port", str(self.port), "--max-num-seqs", "256", "--max-model-len", "4096"]
        mode = ["--no-async-scheduling"] if kind == "rust-sync" else []
        cmd = [mock_bin, "--tokenizer", TOKENIZER, "--forward-ms", str(forward_ms), *common, *mode]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_ready(self.url, self.proc)
        self.kind = kind

    def trace(self, which: str = "step") -> list[int]:
        if not self.kind.startswith("rust"):
            return []
        with urllib.request.urlopen(self.url + f"/bench/{which}_trace") as r:
            return json.loads(r.read())

    def loop_cpu_ns(self) -> int:
        """CPU time of the server's step-loop thread so far (0 when not found)."""
        base = f"/proc/{self.proc.pid}/task"
        try:
            for tid in os.listdir(base):
                with open(f"{base}/{tid}/comm") as f:
                    if f.read().strip() == "yoco-step-loop":
                        with open(f"{base}/{tid}/schedstat") as g:
                            return int(g.read().split()[0])
        except OSError:
            pass
        return 0

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def load(client: str, url: str, conc: int, tokens: int, requests: int = 0, chat: bool = False) -> dict:
    cmd = [client, "--url", url, "--concurrency", str(conc), "--max-tokens", str(tokens)]
    if requests:
        cmd += ["--requests", str(requests)]
    if chat:
        cmd += ["--chat"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def pct(v: list, p: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(round((len(v) - 1) * p)))] if v else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer tokens (a smoke run)")
    ap.add_argument("--rust-modes", default="async,sync", help="the Rust loop's scheduling modes to run")
    a = ap.parse_args()
    tokens = 64 if a.quick else 256
    kinds = ["rust" if m == "async" else "rust-sync" for m in a.rust_modes.split(",")]
    mock_bin, client = build()
    rows = []
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    # 1. Ceiling.
    for kind in kinds:
        srv = Server(kind, mock_bin, 0.0)
        try:
            load(client, srv.url, 16, 16)  # warm-up
            for conc in (1, 64, 256):
                r = load(client, srv.url, conc, tokens)
                rows.append(("ceiling", kind, conc, r))
                print(kind, conc, json.dumps(r), flush=True)
        finally:
            srv.stop()
    # 2. Overlap and 3. jitter.
    extra = []
    for kind in kinds:
        for fwd in (5.0, 0.0):
            srv = Server(kind, mock_bin, fwd)
            try:
                load(client, srv.url, 16, 8)
                srv.trace()
                srv.trace("gap")
                cpu0 = srv.loop_cpu_ns()
                r = load(client, srv.url, 256, tokens)
                cpu = (srv.loop_cpu_ns() - cpu0) / max(r["steps"], 1) / 1e3
                tr, gaps = srv.trace(), srv.trace("gap")
                steps_per_s = r["steps"] / r["wall_s"]
                med = statistics.median(tr) if tr else float("nan")
                r2 = load(client, srv.url, 256, tokens, requests=768)
                tr2 = srv.trace()
                extra.append((kind, fwd, r, steps_per_s, med, pct(gaps, 0.5), pct(gaps, 0.99), cpu, r2,
                              pct(tr2, 0.5), pct(tr2, 0.99)))
                print(kind, fwd, json.dumps(r), json.dumps(r2), flush=True)
            finally:
                srv.stop()
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print("\n| server | streams | tokens/s | TTFT p50 / p95 (ms) | mean step period (ms) | client CPU share |")
    print("|---|---|---|---|---|---|")
    for _, kind, conc, r in rows:
        print(f"| {kind} | {conc} | {r['tokens_per_s']:,.0f} | {r['ttft_p50_ms']:.1f} / {r['ttft_p95_ms']:.1f} | "
              f"{r['step_mean_ms']:.3f} | {r['client_cpu_share']:.2f} |")
    print("\n| server | forward | 256 streams: steps/s (burst mean) | median step (ms) | collect→launch p50 / p99 "
          "(µs) | loop CPU per step (µs) | 768 arriving: tokens/s | step p50 / p99 (ms) | p99 / p50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, fwd, r, sps, med, g50, g99, cpu, r2, p50, p99 in extra:
        ratio = p99 / p50 if p50 == p50 and p50 else float("nan")
        rust = kind.startswith("rust")
        gap = f"{g50:.0f} / {g99:.0f}" if rust else "–"
        cpu_s = f"{cpu:.0f}" if rust else "–"
        print(f"| {kind} | {fwd:g} ms | {sps:,.0f} | {med / 1e3:.3f} | {gap} | {cpu_s} | "
              f"{r2['tokens_per_s']:,.0f} | {p50 / 1e3:.3f} / {p99 / 1e3:.3f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
