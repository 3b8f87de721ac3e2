"""A/B of two builds of the Rust serving path, in one run.

Two ``yoco_mock_server`` binaries (e.g. a commit and its parent: ``cargo build --release -p yoco-server
--bin yoco_mock_server`` at each, copied aside) take alternating rounds of the same load from the same
Rust client (``benches/rust/serve_load.rs``):

- a 256-stream x 256-token burst over a zero-cost executor: TTFT p50 of the burst, streamed tokens/s;
- 768 requests through 256 streams at a 5 ms forward: step period p99 / p50 from the loop's step trace.

Alternating rounds put both builds under the same machine load; compare the medians. ``--chat`` sends
the same load as streamed chat completions (one user message; the checkpoint's chat template).

    .venv/bin/python benches/serve_ab.py NAME=BINARY NAME=BINARY [ROUNDS] [--client PATH] [--chat]

``--client`` defaults to the ``serve_load`` bench binary that ``benches/serve_ceiling.py`` builds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_ceiling import TOKENIZER, build, free_port, load, pct, wait_ready  # noqa: E402


def start(binary: str, forward_ms: float):
    port = free_port()
    proc = subprocess.Popen([binary, "--tokenizer", TOKENIZER, "--forward-ms", str(forward_ms), "--port", str(port),
                             "--max-num-seqs", "256", "--max-model-len", "4096"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def step_trace(url: str) -> list[int]:
    with urllib.request.urlopen(url + "/bench/step_trace") as r:
        return json.loads(r.read())


def stop(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs=2, help="NAME=BINARY")
    ap.add_argument("rounds", nargs="?", type=int, default=3)
    ap.add_argument("--client", default=None)
    ap.add_argument("--chat", action="store_true", help="streamed chat completions instead of completions")
    a = ap.parse_args()
    chat = a.chat
    client = a.client or build()[1]
    bins = dict(b.split("=", 1) for b in a.builds)
    res = {k: {"ttft": [], "tps": [], "jitter": []} for k in bins}
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(a.rounds):
        for name, binary in bins.items():
            proc, url = start(binary, 0.0)
            try:
                load(client, url, 16, 16, chat=chat)  # warm-up
                x = load(client, url, 256, 256, chat=chat)
                res[name]["ttft"].append(x["ttft_p50_ms"])
                res[name]["tps"].append(x["tokens_per_s"])
            finally:
                stop(proc)
            proc, url = start(binary, 5.0)
            try:
                load(client, url, 16, 8, chat=chat)
                step_trace(url)  # drop the warm-up's steps
                load(client, url, 256, 256, requests=768, chat=chat)
                tr = step_trace(url)
                res[name]["jitter"].append(pct(tr, 0.99) / pct(tr, 0.5))
            finally:
                stop(proc)
            d = res[name]
            print(f"round {r} {name}: TTFT p50 {d['ttft'][-1]:.1f} ms, {d['tps'][-1]:,.0f} tokens/s, "
                  f"step p99/p50 {d['jitter'][-1]:.3f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print("\n| build | TTFT p50 of the 256 burst (ms) | tokens/s | step p99 / p50, 768 arriving at 5 ms |")
    print("|---|---|---|---|")
    for name, d in res.items():
        print(f"| {name} | {statistics.median(d['ttft']):.1f} | {statistics.median(d['tps']):,.0f} | "
              f"{statistics.median(d['jitter']):.3f} |")


if __name__ == "__main__":
    main()
