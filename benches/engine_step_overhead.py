"""Per-step engine overhead outside the model forward, at 1, 64 and 256 concurrent decoding requests.

``Engine.step()`` runs one step of the Rust step loop (``_core.EngineLoop`` in manual mode: schedule,
update, detokenization and stop strings in Rust) around the Python ``StepExecutor`` (the plan's
``ForwardBatch``, the model, the sampler), then turns the step's events into ``RequestOutput``s. The
model is replaced by a mock that returns a ready logits tensor (its time is measured and subtracted,
and is a few microseconds), so what remains is the engine. Two output modes: ``final`` (what
``generate`` uses: no per-request Python per step) and ``delta`` (streaming: one RequestOutput per
request per step). Reported: mean, p50 and p90 per step, and the means of its parts: ``executor``
(the StepExecutor's launch and collect: batch views, sampling, copies), ``loop`` (the rest of the Rust
step), ``outputs`` (events to ``RequestOutput``s), which add up to the mean.

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
    mock = MockExecutor(eng.vocab_size, 256 + 16)
    eng._runner = mock  # what each step calls ``execute`` on (the executor, or its CUDA-graph runner)
    p = SamplingParams(temperature=0.0, max_tokens=steps + 50, ignore_eos=True, output_kind=kind, stop=["\n\n\n"])
    for i in range(conc):
        eng.add_request(f"r{i}", [2] + [100 + i % 1000] * 64, p)
    # Warm up past the prefill and into steady decode.
    for _ in range(5):
        eng.step()
    parts = {"executor": 0.0, "core": 0.0}

    def timed(name, fn):
        def w(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            parts[name] += time.perf_counter() - t
            return r
        return w

    ex = eng._executor  # the loop calls these by name on the instance
    ex.launch = timed("executor", ex.launch)
    ex.collect = timed("executor", ex.collect)

    class CoreProxy:  # the Rust object's methods cannot be patched
        def __init__(self, inner):
            self._inner = inner
            self.step = timed("core", inner.step)

        def __getattr__(self, n):
            return getattr(self._inner, n)

    eng._core = CoreProxy(eng._core)
    per_step = []
    mock.time = 0.0
    for _ in range(steps):
        m0 = mock.time
        t = time.perf_counter()
        eng.step()
        per_step.append(time.perf_counter() - t - (mock.time - m0))
    eng._core = eng._core._inner
    eng.close()
    assert mock.calls >= steps, "the mock executor was not called: the engine steps through something else"
    ms = lambda v: 1e3 * v / steps  # noqa: E731
    executor = ms(parts["executor"] - mock.time)
    return dict(conc=conc, kind=kind.name.lower(), mean_ms=1e3 * statistics.mean(per_step),
                median_ms=1e3 * statistics.median(per_step),
                p90_ms=1e3 * sorted(per_step)[int(0.9 * len(per_step))],
                executor_ms=executor, loop_ms=ms(parts["core"]) - executor - ms(mock.time))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| concurrent | outputs | mean ms/step | p50 | p90 | executor | loop | outputs |")
    print("|---|---|---|---|---|---|---|---|")
    for conc in (1, 64, 256):
        for kind in (RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA):
            r = measure(conc, args.steps, kind)
            rest = max(0.0, r["mean_ms"] - r["executor_ms"] - r["loop_ms"])
            print(f"| {conc} | {r['kind']} | {r['mean_ms']:.3f} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} | "
                  f"{r['executor_ms']:.3f} | {r['loop_ms']:.3f} | {rest:.3f} |", flush=True)


if __name__ == "__main__":
    main()
