"""Long-context retrieval accuracy of the bundled model, in every engine configuration.

    .venv/bin/python evals/retrieval.py [--limit N] [--server]

The questions (``evals/data/recall.jsonl``, from held-out text) scatter ``- key = value`` facts over
prompts of 2x, 4x and 8x the model's 64-token sliding window and ask for one fact placed more than a
window before the question: the answer is reachable only through the full-attention layers (and, in
the last layers, the KV they share). Greedy decoding; an answer is right when the generated text up
to its first newline is the value.

Every configuration must give the same answers as the reference one (fast prefill on, prefix caching
at sub-block grain): fast prefill off; prefix caching off, at full-block grain, at sub-block grain
(two questions per context share a long prefix, so the cache is hit); chunked prefill (a 48-token
step budget); preemption (a KV pool of a few blocks, every request at once); and, with ``--server``,
``yoco-serve``'s /v1/completions. Prints a Markdown table (for benches/RESULTS.md) and exits non-zero
when any configuration disagrees.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "recall.jsonl")
MAX_TOKENS = 8

#: name -> EngineConfig overrides (CPU engine; block 64 so that full-block and sub-block caching differ).
CONFIGS = {
    "reference (fast prefill, sub-block cache)": dict(block_size=64, sub_block_size=16),
    "fast prefill off": dict(block_size=64, sub_block_size=16, kv_sharing_fast_prefill=False),
    "prefix caching off": dict(block_size=64, enable_prefix_caching=False),
    "prefix caching, full-block": dict(block_size=64, sub_block_size=64),
    "chunked prefill (48-token steps)": dict(block_size=16, max_num_batched_tokens=48),
    "preemption (tiny KV pool)": dict(block_size=16, num_gpu_blocks_override=40, max_num_seqs=16),
}


def load(limit: int | None = None) -> list[dict]:
    """The questions; ``limit``: the first N of each length."""
    rows = [json.loads(line) for line in open(DATA, encoding="utf-8")]
    if limit is None:
        return rows
    seen: dict[int, int] = defaultdict(int)
    out = []
    for r in rows:
        if seen[r["multiple"]] < limit:
            seen[r["multiple"]] += 1
            out.append(r)
    return out


def answer_of(text: str) -> str:
    return text.split("\n")[0].strip()


def run_engine(rows: list[dict], model: str | None = None, **over) -> tuple[list[str], dict]:
    """Greedy answers from an in-process engine on the bundled model, and engine facts (preemptions,
    cached prompt tokens)."""
    from yoco_rs import Engine, SamplingParams

    eng = Engine(model, device="cpu", seed=0, **over)
    try:
        # 8 tokens without a stop string: decoding grows the sequences over block boundaries (so a tiny
        # KV pool preempts), and the answer is the first line.
        sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        outs = eng.generate([r["prompt"] for r in rows], sp, use_tqdm=False)
        m = eng.get_metrics()
        facts = {"preemptions": m.num_preemptions, "prefix-cache hit tokens": m.prefix_cache_hits,
                 "cross-decoder rows": m.cross_rows, "steps": m.num_steps}
        return [answer_of(o.outputs[0].text) for o in outs], facts
    finally:
        eng.close()


def run_server(rows: list[dict], model: str | None = None, *flags: str) -> list[str]:
    """Greedy answers through a ``yoco-serve`` process (``flags``) and its /v1/completions."""
    import httpx

    sys.path.insert(0, HERE)
    from serve_process import yoco_serve

    with yoco_serve(*([model] if model else []), *flags) as base, httpx.Client(base_url=base, timeout=300) as c:
        out = []
        for r in rows:
            resp = c.post("/v1/completions", json={"prompt": r["prompt"], "max_tokens": MAX_TOKENS,
                                                   "temperature": 0, "ignore_eos": True})
            resp.raise_for_status()
            out.append(answer_of(resp.json()["choices"][0]["text"]))
        return out


def accuracy(rows: list[dict], answers: list[str]) -> dict[int, float]:
    hit: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r, a in zip(rows, answers):
        hit[r["multiple"]][0] += int(a == r["answer"])
        hit[r["multiple"]][1] += 1
    return {m: h / n for m, (h, n) in sorted(hit.items())}


def evaluate(rows: list[dict], configs: dict | None = None, server: bool = False, model: str | None = None) -> dict:
    """``{name: {"answers", "accuracy", "facts"}}`` for every configuration."""
    results = {}
    for name, over in (configs or CONFIGS).items():
        answers, facts = run_engine(rows, model, **over)
        results[name] = {"answers": answers, "accuracy": accuracy(rows, answers), "facts": facts}
    if server:
        answers = run_server(rows, model)
        results["yoco-serve /v1/completions"] = {"answers": answers, "accuracy": accuracy(rows, answers), "facts": {}}
    return results


def table(rows: list[dict], results: dict) -> str:
    ref = next(iter(results.values()))["answers"]
    mults = sorted({r["multiple"] for r in rows})
    lines = ["| configuration | " + " | ".join(f"{m}x window ({m * 64} tok)" for m in mults)
             + " | same answers as reference | notes |", "|---" * (len(mults) + 3) + "|"]
    for name, res in results.items():
        acc = " | ".join(f"{100 * res['accuracy'][m]:.1f}%" for m in mults)
        same = sum(a == b for a, b in zip(res["answers"], ref))
        notes = ", ".join(f"{k} {v}" for k, v in res["facts"].items())
        lines.append(f"| {name} | {acc} | {same}/{len(ref)} | {notes} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, help="first N questions per length (default: all 80)")
    ap.add_argument("--server", action="store_true", help="also through a live yoco-serve")
    ap.add_argument("--model", help="checkpoint directory (default: the bundled model)")
    args = ap.parse_args()
    rows = load(args.limit)
    results = evaluate(rows, server=args.server, model=args.model)
    print(f"{len(rows)} questions\n")
    print(table(rows, results))
    ref = next(iter(results.values()))["answers"]
    bad = [n for n, r in results.items() if r["answers"] != ref]
    if bad:
        print(f"\nDISAGREE with the reference: {bad}")
        sys.exit(1)


if __name__ == "__main__":
    main()
