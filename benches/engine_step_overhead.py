"""Per-step engine overhead outside the model forward, at 1, 64 and 256 concurrent decoding requests.

The executor is replaced by a mock that returns a ready logits tensor (its time is measured and
subtracted, and is a few microseconds), so what remains is the engine: schedule (Rust), ForwardBatch
views and block-table gather, sampling (greedy, on the CPU), update (Rust), detokenization and stop
strings (Rust TextBatch) and the Python bookkeeping and outputs. Two output modes: ``final`` (what
``generate`` uses: no per-request Python per step) and ``delta`` (streaming: one RequestOutput per
request per step, what a server pays). Target: <= 1 ms per step at 256. Reported: mean, p50 and p90
per step; the per-part columns are means, so they add up to the mean (``other`` is the rest: Python
bookkeeping and outputs).

    OMP_NUM_THREADS=1 .venv/bin/python benches/engine_step_overhead.py [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from yoco_rs import Engine, RequestOutputKind, SamplingParams


class MockExecutor:
    """Returns logits whose argmax cycles through ordinary tokens (so the detokenizer has work)."""

    def __init__(self, vocab: int, rows: int):
        self.table = torch.full((rows, vocab), -5.0)
        for i in range(rows):
            self.table[i, 300 + (i * 7) % 1500] = 5.0
        self.calls = 0
        self.time = 0.0

    def execute(self, batch):
        t = time.perf_counter()
        x = self.table[(self.calls % 16): (self.calls % 16) + batch.num_cross]
        self.calls += 1
        self.time += time.perf_counter() - t
        return x


def measure(conc: int, steps: int, kind: RequestOutputKind) -> dict:
    eng = Engine(max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192, num_gpu_blocks_override=4096)
    mock = MockExecutor(eng._rt.vocab_size, 256 + 16)
    eng._runner = mock  # what each step calls ``execute`` on (the executor, or its CUDA-graph runner)
    p = SamplingParams(temperature=0.0, max_tokens=steps + 50, ignore_eos=True, output_kind=kind, stop=["\n\n\n"])
    for i in range(conc):
        eng.add_request(f"r{i}", [2] + [100 + i % 1000] * 64, p)
    # Warm up past the prefill and into steady decode.
    for _ in range(5):
        eng.step()
    parts = {"schedule": 0.0, "sample": 0.0, "update": 0.0, "text": 0.0, "batch": 0.0}

    def timed(name, fn):
        def w(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            parts[name] += time.perf_counter() - t
            return r
        return w

    # The Rust objects' methods cannot be patched: wrap them in thin proxies.
    class Proxy:
        def __init__(self, inner, names):
            self._inner = inner
            for n, label in names.items():
                setattr(self, n, timed(label, getattr(inner, n)))

        def __getattr__(self, n):
            return getattr(self._inner, n)

    eng._sched = Proxy(eng._sched, {"schedule": "schedule", "update": "update"})
    eng._text = Proxy(eng._text, {"step": "text"})
    eng._sampler.sample = timed("sample", eng._sampler.sample)
    eng._forward_batch = timed("batch", eng._forward_batch)
    per_step = []
    mock.time = 0.0
    for _ in range(steps):
        m0 = mock.time
        t = time.perf_counter()
        eng.step()
        per_step.append(time.perf_counter() - t - (mock.time - m0))
    eng.close()
    assert mock.calls >= steps, "the mock executor was not called: the engine steps through something else"
    return dict(conc=conc, kind=kind.name.lower(), mean_ms=1e3 * statistics.mean(per_step),
                median_ms=1e3 * statistics.median(per_step),
                p90_ms=1e3 * sorted(per_step)[int(0.9 * len(per_step))],
                **{k + "_ms": 1e3 * v / steps for k, v in parts.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| concurrent | outputs | mean ms/step | p50 | p90 | schedule | batch | sample | update | text+stop "
          "| other |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for conc in (1, 64, 256):
        for kind in (RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA):
            r = measure(conc, args.steps, kind)
            known = sum(r[k + "_ms"] for k in ("schedule", "batch", "sample", "update", "text"))
            print(f"| {conc} | {r['kind']} | {r['mean_ms']:.3f} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} | "
                  f"{r['schedule_ms']:.3f} | {r['batch_ms']:.3f} | {r['sample_ms']:.3f} | {r['update_ms']:.3f} | "
                  f"{r['text_ms']:.3f} | {max(0.0, r['mean_ms'] - known):.3f} |", flush=True)


if __name__ == "__main__":
    main()
