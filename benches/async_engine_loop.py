"""AsyncEngine (the Rust step loop on its own thread, events through a reader thread and asyncio) against
Engine.generate (the same loop stepped by hand on the caller's thread; until 2026-12-04 a Python loop) on
the same model and workload: output tokens/s of ``C`` concurrent greedy requests of ``T`` tokens each (``ignore_eos``), and the
process CPU seconds per 1,000 output tokens. The two alternate three times per concurrency; medians, and
the ratio AsyncEngine / Engine (these machines are shared and noisy: the ratio within one run is what counts).

    OMP_NUM_THREADS=1 .venv/bin/python benches/async_engine_loop.py [--conc 1 16 64] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from yoco_rs import AsyncEngine, Engine, RequestOutputKind, SamplingParams

SETTINGS = dict(max_model_len=512, max_num_seqs=64, max_num_batched_tokens=512)


def prompts(conc: int, rep: int) -> list[str]:
    return [f"request {i} of run {rep}: tell me about the sea" for i in range(conc)]


def params(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA)


def timed(fn):
    c0, t0 = os.times(), time.perf_counter()
    n = fn()
    c1, t1 = os.times(), time.perf_counter()
    return n / (t1 - t0), (c1.user + c1.system - c0.user - c0.system) / n * 1000


def run_sync(eng: Engine, conc: int, tokens: int, rep: int):
    def go():
        outs = eng.generate(prompts(conc, rep), params(tokens), use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)
    return timed(go)


def run_async(eng: AsyncEngine, loop: asyncio.AbstractEventLoop, conc: int, tokens: int, rep: int):
    async def one(p):
        n = 0
        async for out in eng.stream(p, params(tokens)):
            n += len(out.outputs[0].token_ids)
        return n

    async def all_():
        return sum(await asyncio.gather(*(one(p) for p in prompts(conc, rep))))

    return timed(lambda: loop.run_until_complete(all_()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    aeng = AsyncEngine(**SETTINGS)
    loop.run_until_complete(aeng.wait_ready())
    seng = Engine(**SETTINGS)
    print("| concurrency | tokens | Engine (manual loop) tok/s | AsyncEngine (threaded loop) tok/s | ratio "
          "| CPU s / 1k tok, Engine | CPU s / 1k tok, AsyncEngine |")
    print("|---|---|---|---|---|---|---|")
    for conc in args.conc:
        run_sync(seng, conc, 4, -1)  # warm both
        run_async(aeng, loop, conc, 4, -1)
        s, a = [], []
        for rep in range(3):
            s.append(run_sync(seng, conc, args.tokens, rep))
            a.append(run_async(aeng, loop, conc, args.tokens, rep))
        st, at = statistics.median(x[0] for x in s), statistics.median(x[0] for x in a)
        sc, ac = statistics.median(x[1] for x in s), statistics.median(x[1] for x in a)
        print(f"| {conc} | {args.tokens} | {st:.0f} | {at:.0f} | {at / st:.2f} | {sc:.2f} | {ac:.2f} |", flush=True)
    loop.run_until_complete(aeng.shutdown(drain_timeout=0))
    seng.close()


if __name__ == "__main__":
    main()
