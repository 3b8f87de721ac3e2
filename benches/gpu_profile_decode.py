"""Where a CUDA-graph decode step of E2B (bf16, random weights) spends its time, on one GPU.

    PYTHONPATH=python:tests:kernels:benches python3 benches/gpu_profile_decode.py   # ~1 minute on an H200
    ... gpu_profile_decode.py --dry-run   # the CPU: tiny model, graph replay, no device timers (CI runs it)

For batch 1 and 64 at ~512 tokens of context: the step's wall time, its device time (CUDA events around
the graph replay), the weight-read floor (bytes of the weights a decode step must read / measured copy
bandwidth), kernels per step and the top kernels by device time (``torch.profiler`` over a few replays),
with the torch forms, with only the RMSNorm kernel and with every fusion of ``ops.GPU_FUSIONS``, and how
far the first decode step's logits move between them.
``gpu_check.sh`` says *how fast*; this says *why*."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch


def weight_read_bytes(model) -> int:
    """Bytes a decode step must read at least: every weight except the per-layer embedding table and the
    token embedding (gathered by row), counting the tied LM head once."""
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if "embed_tokens_per_layer" in name or ("embed_tokens" in name and p.shape[0] > 100_000):
            continue
        total += p.numel() * p.element_size()
    emb = [p for n, p in model.named_parameters() if n.endswith("embed_tokens.weight")]
    if emb:  # the tied LM head reads the whole token table once per step
        total += emb[0].numel() * emb[0].element_size()
    return total


def copy_bandwidth() -> float:
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU: tiny model, graph replay, no device timers")
    dry = ap.parse_args(argv).dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU, or pass --dry-run to exercise the script on the CPU")
        return 2
    from gemma_random import E2B, TINY_E2B_DEPTH, random_executor
    from step_plans import MiniPlanner, Req

    from yoco_rs.executor.cuda_graphs import GraphedExecutor
    from yoco_rs.kernels.backend import TritonAttentionBackend

    torch.set_grad_enabled(False)
    cfg = TINY_E2B_DEPTH if dry else E2B
    dev = "cpu" if dry else "cuda"

    def sync():
        if not dry:
            torch.cuda.synchronize()

    # q/k norms x0.25 (gemma_random.randomize): untamed, one ulp anywhere changes this random model's tokens
    ex = random_executor(cfg, dtype=torch.float32 if dry else torch.bfloat16, device=dev, seed=3,
                         backend=None if dry else TritonAttentionBackend(), qk_norm_scale=0.25)
    floor_bytes = weight_read_bytes(ex.model)
    bw = float("nan") if dry else copy_bandwidth()
    print(f"device {'cpu (dry run)' if dry else torch.cuda.get_device_name()}, torch {torch.__version__}; weights a "
          f"decode step reads: {floor_bytes / 1e9:.2f} GB -> floor {1e3 * floor_bytes / bw:.2f} ms at the measured "
          f"copy {bw / 1e12:.2f} TB/s", flush=True)
    from yoco_rs.models.gemma3n import ops

    bs, prompt, batches = (16, 24, (1, 2)) if dry else (64, 512, (1, 64))
    per_req = -(-(prompt + 64) // bs)
    nb = 1 + max(batches) * per_req + 8
    ex.allocate_kv(nb, bs)
    windows = [s.window for s in ex.kv_group_specs()]
    steps: dict = {}
    first_logits: dict = {}
    full = set(ops.GPU_FUSIONS)
    variants = [("torch forms", set()), ("Triton RMSNorm", {"rms_norm"}), ("all fusions", full)]
    for name, fusions in variants:  # same run, same weights, graphs captured afresh for each
        ops.GPU_FUSIONS.clear()
        ops.GPU_FUSIONS.update(fusions)
        fused = fusions == full
        graphed = GraphedExecutor(ex, max_num_seqs=max(batches), max_num_batched_tokens=256 if dry else 8192,
                                  max_model_len=per_req * bs, mode="replay" if dry else "graphs",
                                  **({"max_capture_tokens": 16} if dry else {}))
        graphed.capture(progress=False)
        rng = random.Random(0)
        for b in batches:
            planner = MiniPlanner(windows=windows, block_size=bs, num_blocks=nb, max_blocks_per_seq=per_req, seed=b)
            reqs = [Req([rng.randrange(3, cfg["vocab_size"]) for _ in range(prompt)], prompt, max_new=10**9)
                    for _ in range(b)]
            batch = planner.batch(reqs, [prompt] * b)
            MiniPlanner.advance(reqs, [prompt] * b, batch, ex.execute(batch).argmax(-1).cpu())
            walls, devs = [], []
            for i in range(3 if dry else 12):
                batch = planner.batch(reqs, [1] * b)
                if not dry:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                sync()
                t = time.perf_counter()
                if not dry:
                    start.record()
                logits = graphed.execute(batch)
                if not dry:
                    end.record()
                sync()
                if i >= 2:
                    walls.append(time.perf_counter() - t)
                    devs.append(walls[-1] if dry else start.elapsed_time(end) / 1e3)
                if i == 0:
                    first_logits[(name, b)] = logits.float().cpu()
                MiniPlanner.advance(reqs, [1] * b, batch, logits.argmax(-1).cpu())
            batch = planner.batch(reqs, [1] * b)
            activity = torch.profiler.ProfilerActivity.CPU if dry else torch.profiler.ProfilerActivity.CUDA
            reps = 1 if dry else 3
            with torch.profiler.profile(activities=[activity]) as prof:
                for _ in range(reps):
                    graphed.execute(batch)  # same slots rewritten: idempotent
                sync()
            events = prof.key_averages()
            kernels = sum(e.count for e in events) / reps  # (dry run: torch ops, not kernels)
            steps[(name, b)] = statistics.median(walls)
            print(f"\n{name}, batch {b}: step wall {1e3 * statistics.median(walls):.2f} ms, "
                  f"device (events) {1e3 * statistics.median(devs):.2f} ms, {kernels:.0f} kernels per step, "
                  f"self half {graphed.runner.stats.self_kind}", flush=True)
            if fused and not dry:
                for key in ("self_device_time_total", "self_cuda_time_total"):
                    try:
                        print(events.table(sort_by=key, row_limit=16, max_name_column_width=90), flush=True)
                        break
                    except Exception:  # noqa: BLE001 - the key's name changed across torch versions
                        continue
            for q in reqs:
                planner.release(q)
        del graphed
        if not dry:
            torch.cuda.empty_cache()
    ops.GPU_FUSIONS.clear()
    ops.GPU_FUSIONS.update(full)
    for b in batches:
        base = steps[(variants[0][0], b)]
        print(f"batch {b}: " + ", ".join(f"{n} {1e3 * steps[(n, b)]:.2f} ms (x{base / steps[(n, b)]:.2f})"
                                         for n, _ in variants), flush=True)
        ref = first_logits[(variants[0][0], b)]
        for n, _ in variants[1:]:
            got = first_logits[(n, b)]
            same = int((got.argmax(-1) == ref.argmax(-1)).sum())
            print(f"  first decode step's logits, {n} vs torch forms: max |diff| {(got - ref).abs().max().item():.3g} "
                  f"(logits up to {ref.abs().max().item():.3g}), argmax same in {same}/{b} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
