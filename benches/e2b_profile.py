"""Where one decode step of real-size Gemma 3n E2B goes on the CPU: a torch profile of engine steps.

Loads the checkpoint once (``tests/e2b_checkpoint.py`` layout), prefills ``--streams`` prompts of
``--context`` tokens, then profiles ``--steps`` pure-decode engine steps and prints, per step:

* the parts of the step (profiler ranges around the decoder layers, attention, KV writes, embeddings and
  per-layer inputs, logits, step preparation, sampler: ``REGIONS``);
* the matmuls by shape (``aten::linear``/``mm``/``addmm`` and what the CPU linear kernel adds), with the
  weight bytes each reads;
* the other ops by name (self time), the per-layer Python overhead (wall minus op time), and the
  sampler and per-layer gather (host table) rows.

    .venv/bin/python benches/e2b_profile.py MODEL_DIR [--dtype float32] [--streams 1] [--steps 3]
        [--no-batch-invariant]

One process per configuration (the model is ~10 GB in float32): run it once per dtype and stream count.
Any Gemma 3n checkpoint directory works, e.g. a small stand-in of the same layout from
``tests/e2b_checkpoint.build(dir, text=dict(E2B_TEXT, hidden_size=256, ...))`` to try the script.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


KERNEL_CPU = [0.0]
REGIONS = {
    "region: decoder layers (all of them)": ("yoco_rs.models.gemma3n.layer", "DecoderLayer", "forward"),
    "region: attention (backend.attend)": ("yoco_rs.executor.attention_torch", "TorchAttentionBackend", "attend"),
    "region: KV writes (backend.write_kv)": ("yoco_rs.executor.attention_torch", "TorchAttentionBackend", "write_kv"),
    "region: embeddings + per-layer inputs (host table gather)": ("yoco_rs.models.gemma3n.model", "Gemma3nModel", "embed"),
    "region: logits (AltUp unembed, norm, LM head, softcap)": ("yoco_rs.models.gemma3n.model", "Gemma3nModel",
                                                              "compute_logits"),
    "region: step preparation (metadata)": ("yoco_rs.executor.executor", "Executor", "prepare"),
    "region: sampler": ("yoco_rs.executor.sampler", "Sampler", "sample"),
}


def trace_regions() -> None:
    """Profiler ranges around the parts of a step (``REGIONS``), to read their totals off the profile."""
    import importlib

    for name, (mod, cls, meth) in REGIONS.items():
        klass = getattr(importlib.import_module(mod), cls)
        real = getattr(klass, meth)

        def wrapped(*args, _real=real, _name=name, **kw):
            with torch.profiler.record_function(_name):
                return _real(*args, **kw)

        setattr(klass, meth, wrapped)


def trace_kernel() -> None:
    """Makes each ``yoco_cpu`` call a profiler range named by its shape (it is no torch op), and adds its
    thread CPU time to ``KERNEL_CPU``."""
    from yoco_rs.executor import cpu_linear

    real = cpu_linear.kernel_linear

    def traced(x, w, kc, threads):
        with torch.profiler.record_function(f"yoco_cpu.linear {list(x.shape)} x {list(w.shape)}"):
            t = time.thread_time()
            y = real(x, w, kc, threads)
            KERNEL_CPU[0] += time.thread_time() - t
            return y

    cpu_linear.kernel_linear = traced


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-batch-invariant", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from e2b_runs import load_yoco, speed_prompts

    from yoco_rs import SamplingParams

    trace_regions()
    eng = load_yoco(a.model, a.dtype, True, batch_invariant=not a.no_batch_invariant)
    trace_kernel()
    params = SamplingParams(temperature=0.0, max_tokens=a.steps + 3, min_tokens=a.steps + 3, ignore_eos=True)
    for i, p in enumerate(speed_prompts(a.streams, a.context, seed=a.streams)):
        eng.add_request(str(i), p, params)
    eng.step()  # the prefill
    eng.step()  # one decode step, warm
    walls = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(a.steps):
            t = time.perf_counter()
            eng.step()
            walls.append(time.perf_counter() - t)

    while eng.has_unfinished_requests():
        eng.step()
    # plain wall time without the profiler
    plain, cpu = [], []
    for i, p in enumerate(speed_prompts(a.streams, a.context, seed=a.streams + 1)):
        eng.add_request(f"p{i}", p, params)
    eng.step()
    eng.step()
    KERNEL_CPU[0] = 0.0
    for _ in range(a.steps):
        t, c = time.perf_counter(), time.thread_time()
        eng.step()
        plain.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    kernel_cpu = KERNEL_CPU[0]
    n = a.steps
    events = prof.key_averages(group_by_input_shape=True)
    by_shape, by_name, regions = [], collections.Counter(), collections.Counter()
    for e in events:
        self_ms = e.self_cpu_time_total / 1e3 / n
        if e.key in MATMUL or e.key.startswith("yoco_cpu."):
            by_shape.append((e.cpu_time_total / 1e3 / n, e.key, e.input_shapes, e.count // n))
        if e.key.startswith("region: "):
            regions[e.key] += e.cpu_time_total / 1e3 / n
        else:
            by_name[e.key] += self_ms
    total_self = sum(by_name.values())
    wall = 1e3 * sum(walls) / n
    print(f"\n{a.dtype}, {a.streams} stream(s), context {a.context}, batch_invariant={not a.no_batch_invariant}, "
          f"threads {a.threads}, load {open('/proc/loadavg').read().split()[0]}")
    print(f"step: wall {1e3 * sum(plain) / n:.1f} ms, thread CPU {1e3 * sum(cpu) / n:.1f} ms, of which the "
          f"yoco_cpu projections {1e3 * kernel_cpu / n:.1f} ms (no profiler); {wall:.1f} ms wall profiled, op self "
          f"time {total_self:.1f} ms\n")
    print("parts of the step (total time, profiled wall; nested: attention and KV writes are inside the layers):")
    for key in REGIONS:
        print(f"  {regions[key]:8.1f} ms  {key[len('region: '):]}")
    print()
    print("matmuls by shape (total time per step, calls per step):")
    for ms, key, shapes, calls in sorted(by_shape, key=lambda r: -r[0])[: a.top]:
        print(f"  {ms:8.1f} ms  {calls:4d}x  {key:14s} {shapes}")
    print("\nops by self time per step:")
    for key, ms in by_name.most_common(a.top):
        print(f"  {ms:8.1f} ms  {key}")


if __name__ == "__main__":
    main()
