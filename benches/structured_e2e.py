"""End to end on the CPU (bundled tiny model, AsyncEngine, 16 concurrent requests): output tokens/s
with ``response_format`` json_schema (compact JSON of an array of >= 200 integers: it never ends
before ``max_tokens``) vs unconstrained (``ignore_eos``), same prompts and token counts. Alternated
three times; the ratio is what counts on this shared machine.

    OMP_NUM_THREADS=1 .venv/bin/python benches/structured_e2e.py [--tokens 96]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from yoco_rs import AsyncEngine, SamplingParams, StructuredOutputsParams

SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 200}


async def run(eng: AsyncEngine, conc: int, tokens: int, constrained: bool, rep: int) -> float:
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True) if constrained else None
    p = SamplingParams(temperature=1.0, seed=rep, max_tokens=tokens, ignore_eos=not constrained,
                       structured_outputs=so)

    async def one(i):
        n = 0
        async for out in eng.stream(f"request {i} of run {rep}: write numbers", p):
            n = len(out.outputs[0].token_ids)
        return n

    t = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(conc)))
    return sum(counts) / (time.perf_counter() - t)


async def main_async(a) -> None:
    eng = AsyncEngine(None, max_model_len=512, max_num_seqs=32)
    await eng.wait_ready()
    res = {False: [], True: []}
    await run(eng, a.concurrency, 16, True, 99)  # warm-up (compiles the grammar once; it is cached)
    for rep in range(3):
        for c in (False, True):
            res[c].append(await run(eng, a.concurrency, a.tokens, c, rep))
    u, c = statistics.median(res[False]), statistics.median(res[True])
    print(f"| {a.concurrency} | {a.tokens} | {u:.0f} | {c:.0f} | {c / u:.3f} |")
    await eng.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
