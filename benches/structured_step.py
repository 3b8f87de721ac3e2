"""Engine step time with 64 constrained rows vs 64 unconstrained ones, behind a mock forward that takes
5 ms (``time.sleep``: it releases the GIL, as a GPU forward does while the device works). The grammar
masks of a step are started on the Rust thread pool before the forward and collected after it, so they
should hide behind it: target <= 1.05x. The bench also reports how long the engine waited for the masks
after the forward (the masks' time not hidden behind it, plus applying them) and the engine loop thread's
own CPU time per step (``time.thread_time``: what structured outputs add to the step's critical path,
independent of how loaded the machine is; the step-time ratio is not, on a shared box). Rows decode
greedily under a JSON schema that never ends (an array of at least 10,000 integers, compact JSON); the
unconstrained run decodes the same logits.

    OMP_NUM_THREADS=1 .venv/bin/python benches/structured_step.py [--steps 100] [--rows 64] [--reps 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from yoco_rs import Engine, SamplingParams, StructuredOutputsParams

SCHEMA = {"type": "array", "items": {"type": "integer"}, "minItems": 10000}


class SleepyExecutor:
    """A forward that takes ``ms`` and returns fixed random logits."""

    def __init__(self, vocab: int, rows: int, ms: float):
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn((rows, vocab), generator=g)
        self.ms = ms

    def execute(self, batch):
        time.sleep(self.ms / 1e3)
        return self.table[: batch.num_cross].clone()


def run(rows: int, steps: int, constrained: bool, ms: float, waits: list, cpu: list) -> list[float]:
    eng = Engine(max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192, num_gpu_blocks_override=4096)
    eng._runner = SleepyExecutor(eng.vocab_size, rows + 16, ms)
    launch = eng._executor.launch  # the loop calls it by name on the instance

    class TimedMasks:  # the wait for the masks after the forward (0 when they overlapped it)
        def __init__(self, inner):
            self._inner = inner

        def take(self):
            t = time.perf_counter()
            r = self._inner.take()
            waits.append(time.perf_counter() - t)
            return r

    def timed_launch(plan, tables, resumed, masks=None, scoring=None):
        return launch(plan, tables, resumed, None if masks is None else TimedMasks(masks), scoring)

    eng._executor.launch = timed_launch
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True) if constrained else None
    p = SamplingParams(temperature=0.0, max_tokens=steps + 50, ignore_eos=True, structured_outputs=so)
    for i in range(rows):
        eng.add_request(f"r{i}", [2] + [100 + i % 1000] * 32, p)
    for _ in range(5):
        eng.step()
    times = []
    for _ in range(steps):
        t, c = time.perf_counter(), time.thread_time()
        eng.step()
        times.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    eng.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--forward-ms", type=float, default=5.0)
    ap.add_argument("--reps", type=int, default=4, help="interleaved runs of each kind")
    a = ap.parse_args()
    res, waits, cpu = {}, [], {False: [], True: []}
    for rep in range(a.reps):  # interleaved, to spread the shared machine's noise over both
        for c in (False, True):
            w = []
            res.setdefault(c, []).extend(run(a.rows, a.steps, c, a.forward_ms, w, cpu[c]))
            if c:
                waits.extend(w[5:])
    u, c = statistics.median(res[False]), statistics.median(res[True])
    um, cm = statistics.fmean(res[False]), statistics.fmean(res[True])
    wait = statistics.median(waits)
    cu, cc = statistics.median(cpu[False]), statistics.median(cpu[True])
    print("| rows | forward (ms) | unconstrained p50 (ms) | constrained p50 (ms) | ratio p50 | ratio mean | "
          "wait for masks after the forward, p50 (ms) | loop-thread CPU per step, unconstrained / constrained (ms) |")
    print(f"| {a.rows} | {a.forward_ms:.0f} | {1e3 * u:.2f} | {1e3 * c:.2f} | {c / u:.3f} | {cm / um:.3f} | "
          f"{1e3 * wait:.3f} | {1e3 * cu:.2f} / {1e3 * cc:.2f} |")


if __name__ == "__main__":
    main()
