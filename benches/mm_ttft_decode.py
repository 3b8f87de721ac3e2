"""Image inputs on the tiny multimodal checkpoint (tests/mm_tiny.py), CPU:

1. TTFT of an image+text request: a new image (encode + full prefill), the same image again (prefix and
   encoder cache hit), and the same image with prefix caching off (encoder cache hit only). Medians of
   ``--reps`` requests each (fresh images for the cold case).
2. Decode latency while images are encoded: ``--streams`` greedy text streams decode through the
   AsyncEngine while image requests arrive every ``--image-every`` seconds; p50 / p99 inter-token
   latency of the text streams, against the same run without images. Target: p99 <= 2x.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benches/mm_ttft_decode.py``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from mm_tiny import random_image, tiny_mm_model_dir  # noqa: E402

from yoco_rs import AsyncEngine, Engine, SamplingParams  # noqa: E402

TEXT = ("<start_of_turn>user\nDescribe <image_soft_token> in a few words, with some more text around it so the "
        "prompt is not trivially short.<end_of_turn>\n<start_of_turn>model\n")
ENGINE = dict(block_size=16, sub_block_size=16, max_num_batched_tokens=512, kv_cache_memory=64 << 20,
              max_model_len=1024, max_num_seqs=16)


def ttft(engine, img) -> float:
    t0 = time.perf_counter()
    engine.generate({"prompt": TEXT, "multi_modal_data": {"image": img}},
                    SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    return time.perf_counter() - t0


def bench_ttft(path: str, reps: int) -> None:
    with Engine(path, **ENGINE) as e:
        ttft(e, random_image(999))  # warm-up
        cold = [ttft(e, random_image(100 + i)) for i in range(reps)]
        img = random_image(7)
        ttft(e, img)
        warm = [ttft(e, img) for _ in range(reps)]
    with Engine(path, **ENGINE, enable_prefix_caching=False) as e:
        img = random_image(8)
        ttft(e, img)
        enc_only = [ttft(e, img) for _ in range(reps)]
    med = statistics.median
    print(f"TTFT image+text (median of {reps}): new image {med(cold) * 1e3:.1f} ms | same image, prefix + encoder "
          f"cache hit {med(warm) * 1e3:.1f} ms ({med(cold) / med(warm):.1f}x faster) | same image, encoder cache "
          f"only (prefix caching off) {med(enc_only) * 1e3:.1f} ms")


async def decode_run(path: str, streams: int, tokens: int, image_every: float | None) -> tuple[list[float], int]:
    eng = AsyncEngine(path, **ENGINE)
    await eng.wait_ready()
    gaps: list[float] = []

    async def text_stream(i):
        sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        last = None
        async for out in await eng.add_request({"prompt": f"Count slowly from {i} upwards, please."}, sp,
                                               request_id=f"t{i}"):
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now

    async def images(stop: asyncio.Event):
        n = 0
        while not stop.is_set():
            await asyncio.sleep(image_every)
            sp = SamplingParams(max_tokens=2, temperature=0.0)
            s = await eng.add_request({"prompt": TEXT, "multi_modal_data": {"image": random_image(500 + n)}}, sp,
                                      request_id=f"img{n}")
            n += 1
            asyncio.ensure_future(_drain(s))
        return n

    stop = asyncio.Event()
    img_task = asyncio.ensure_future(images(stop)) if image_every else None
    await asyncio.gather(*(text_stream(i) for i in range(streams)))
    n_images = 0
    if img_task is not None:
        stop.set()
        n_images = await img_task
    await eng.shutdown(drain_timeout=30)
    return gaps, n_images


async def _drain(stream):
    async for _ in stream:
        pass


def bench_decode(path: str, streams: int, tokens: int, image_every: float) -> None:
    base, _ = asyncio.run(decode_run(path, streams, tokens, None))
    with_img, n = asyncio.run(decode_run(path, streams, tokens, image_every))
    p = lambda xs, q: float(np.percentile(np.asarray(xs) * 1e3, q))  # noqa: E731
    print(f"decode ITL, {streams} text streams x {tokens} tokens: without images p50 {p(base, 50):.1f} ms p99 "
          f"{p(base, 99):.1f} ms | with {n} image requests (one every {image_every}s) p50 {p(with_img, 50):.1f} ms "
          f"p99 {p(with_img, 99):.1f} ms | p99 ratio {p(with_img, 99) / p(base, 99):.2f}x (target <= 2x)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--image-every", type=float, default=0.5)
    ap.add_argument("--skip-ttft", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        tiny_mm_model_dir(d)
        if not a.skip_ttft:
            bench_ttft(d, a.reps)
        if not a.skip_decode:
            bench_decode(d, a.streams, a.tokens, a.image_every)


if __name__ == "__main__":
    main()
