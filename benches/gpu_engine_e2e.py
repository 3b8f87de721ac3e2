"""The whole product on a GPU: ``Engine`` and ``yoco-serve`` with the bundled model, against the CPU.

    PYTHONPATH=python:tests python3 benches/gpu_engine_e2e.py     # needs the compiled yoco_rs._core

``gpu_check.sh`` drives the executor through a test planner; this goes through the Rust core, the
runtime's sizing, the host-resident per-layer-embedding staging and the CUDA graphs as a user meets them:

1. greedy tokens, float32: CPU vs CUDA (graphs, per-layer embeddings on the host), CUDA with the table on
   the device, CUDA eager;
2. bfloat16 throughput on CUDA, 64 prompts x 128 tokens;
3. ``yoco-serve --device cuda``: one completion over HTTP.
Each part reports and the next still runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
import urllib.request

DEV = os.environ.get("E2E_DEVICE", "cuda")  # "cpu" exercises the script's glue on a machine without a GPU

PROMPTS = [f"{w} number {i} says that" for i, w in enumerate(
    ["The river", "A list of files", "Set the value", "In the morning", "Return the module", "The key",
     "Every request", "When the server", "Our model", "The window", "Copy the block", "A short story",
     "The first layer", "Load the table", "Python code", "The answer"])]


def log(msg: str) -> None:
    print(msg, flush=True)


def greedy_tokens(engine, prompts, n):
    from yoco_rs import SamplingParams

    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


def part_tokens() -> None:
    from yoco_rs import Engine

    runs = {}
    for name, kw in (("cpu fp32", dict(device="cpu", dtype="float32")),
                     ("cuda fp32 graphs, host table", dict(device=DEV, dtype="float32")),
                     ("cuda fp32 graphs, table on device", dict(device=DEV, dtype="float32",
                                                               per_layer_embeddings_on_device=True)),
                     ("cuda fp32 eager", dict(device=DEV, dtype="float32", enforce_eager=True))):
        t = time.perf_counter()
        e = Engine(kv_cache_memory=1 << 30, **kw)  # four engines one after another: a small KV pool each
        load = time.perf_counter() - t
        t = time.perf_counter()
        runs[name] = greedy_tokens(e, PROMPTS, 32)
        log(f"  {name:<36} load {load:5.1f} s, 16 x 32 greedy tokens in {time.perf_counter() - t:5.2f} s; "
            f"{e.memory_split}")
        del e
        free_device()
    ref = runs["cpu fp32"]
    for name, toks in runs.items():
        same = sum(a == b for x, y in zip(toks, ref) for a, b in zip(x, y))
        first_diff = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(toks, ref)]
        log(f"  {name:<36} vs cpu fp32: {'IDENTICAL' if toks == ref else f'{same}/512 tokens agree'}"
            f"{'' if toks == ref else f' (first differing position per prompt {first_diff})'}")
    g = runs["cuda fp32 graphs, host table"]
    log(f"  host table vs table on device: {'IDENTICAL' if g == runs['cuda fp32 graphs, table on device'] else 'DIFFERENT'}; "
        f"graphs vs eager: {'IDENTICAL' if g == runs['cuda fp32 eager'] else 'DIFFERENT'}")


def free_device() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def part_throughput() -> None:
    from yoco_rs import Engine

    e = Engine(device=DEV, dtype="bfloat16")  # the default sizing: KV from a fraction of free memory
    log(f"  {e.memory_split}; KV holds {e.kv_capacity_tokens:,} tokens")
    prompts = [PROMPTS[i % 16] + " " * (i // 16) for i in range(64)]
    greedy_tokens(e, prompts[:4], 8)  # warm-up
    t = time.perf_counter()
    toks = greedy_tokens(e, prompts, 128)
    dt = time.perf_counter() - t
    log(f"  bf16, 64 prompts x 128 tokens: {sum(map(len, toks)) / dt:,.0f} generated tokens/s ({dt:.2f} s)")
    del e
    free_device()


def part_serve() -> None:
    with socket.socket() as s:  # a free port (CI runs test shards side by side)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "yoco_rs.serve.cli", "--port", str(port), "--device", DEV],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        t = time.perf_counter()
        while time.perf_counter() - t < 90:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except Exception:  # noqa: BLE001 - not up yet
                if proc.poll() is not None:
                    raise RuntimeError("yoco-serve exited: " + proc.stdout.read()[-2000:])
                time.sleep(0.5)
        up = time.perf_counter() - t
        body = json.dumps({"model": "yoco-tiny", "prompt": "The river number 0 says that", "max_tokens": 24,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t = time.perf_counter()
        out = json.loads(urllib.request.urlopen(req, timeout=30).read())
        log(f"  up in {up:.1f} s; completion in {1e3 * (time.perf_counter() - t):.0f} ms: "
            f"{out['choices'][0]['text']!r} ({out['choices'][0]['finish_reason']})")
    finally:
        proc.terminate()
        try:
            rest = proc.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            rest = proc.communicate()[0]
        log("  server log (last lines):\n    " + "\n    ".join(rest.strip().splitlines()[-8:]))


def main() -> int:
    ok = True
    for num, (title, part) in enumerate((("greedy tokens through the engine, CPU vs CUDA", part_tokens),
                                         ("bf16 throughput through the engine", part_throughput),
                                         ("yoco-serve --device cuda", part_serve)), 1):
        log(f"\n== {num}/3 {title}")
        try:
            part()
        except Exception:  # noqa: BLE001 - reported; the next part still runs
            ok = False
            log(f"  RAISED:\n{traceback.format_exc()}")
    log(f"\ngpu_engine_e2e: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
