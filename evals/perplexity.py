"""Held-out perplexity of the bundled model, computed by yoco-rs (prompt logprobs) and by transformers.

    .venv/bin/python evals/perplexity.py [--limit N] [--model DIR]

Each held-out document (``evals/data/heldout_text.jsonl``: docstrings and pydoc topics never trained
on) is scored as one prompt: yoco-rs returns every prompt token's logprob (``prompt_logprobs=0``, fast
prefill on and off), transformers' ``Gemma3nForCausalLM`` loads the same checkpoint and scores the same
token ids. Reports the perplexity (exp of the mean negative logprob over all scored tokens) of each and
the largest per-token difference; they must agree to float32 tolerance.
"""

from __future__ import annotations

import argparse
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "heldout_text.jsonl")


def load(limit: int | None = None) -> list[str]:
    rows = [json.loads(line)["text"] for line in open(DATA, encoding="utf-8")]
    return rows[:limit] if limit else rows


def yoco_logprobs(token_ids: list[list[int]], model: str | None = None, **over) -> list[list[float]]:
    """Per document, the logprob of tokens 1..n-1 given their prefix, from an engine's prompt logprobs."""
    from yoco_rs import Engine, SamplingParams

    eng = Engine(model, device="cpu", seed=0, max_model_len=4096, **over)
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        outs = eng.generate([{"prompt_token_ids": ids} for ids in token_ids], sp, use_tqdm=False)
        return [[o.prompt_logprobs[i][t].logprob for i, t in enumerate(ids) if i > 0]
                for o, ids in zip(outs, token_ids)]
    finally:
        eng.close()


def hf_logprobs(token_ids: list[list[int]], model_dir: str) -> list[list[float]]:
    import torch
    from transformers import Gemma3nForCausalLM

    m = Gemma3nForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in token_ids:
            x = torch.tensor([ids])
            lp = torch.log_softmax(m(x).logits[0].float(), dim=-1)
            out.append(lp[:-1].gather(1, x[0, 1:, None])[:, 0].tolist())
    return out


def perplexity(lps: list[list[float]]) -> float:
    flat = [v for doc in lps for v in doc]
    return math.exp(-sum(flat) / len(flat))


def evaluate(limit: int | None = None, model: str | None = None) -> dict:
    from yoco_rs import bundled
    from yoco_rs.tokenizer import Tokenizer

    model_dir = model or bundled.default_model_dir()
    tok = Tokenizer(model_dir)
    ids = [tok.encode(t) for t in load(limit)]
    res = {"documents": len(ids), "tokens": sum(len(i) - 1 for i in ids)}
    hf = hf_logprobs(ids, model_dir)
    res["transformers"] = perplexity(hf)
    for name, over in (("yoco-rs fast prefill", {}), ("yoco-rs full prefill", {"kv_sharing_fast_prefill": False})):
        lps = yoco_logprobs(ids, model, **over)
        res[name] = perplexity(lps)
        res[name + " max |dlogprob|"] = max(abs(a - b) for x, y in zip(lps, hf) for a, b in zip(x, y))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, help="first N documents (default: all)")
    ap.add_argument("--model", help="checkpoint directory (default: the bundled model)")
    args = ap.parse_args()
    r = evaluate(args.limit, args.model)
    print(f"{r['documents']} held-out documents, {r['tokens']} scored tokens\n")
    print("| scorer | perplexity | max per-token |logprob - transformers'| |\n|---|---|---|")
    print(f"| transformers {__import__('transformers').__version__} (float32) | {r['transformers']:.4f} | - |")
    for name in ("yoco-rs fast prefill", "yoco-rs full prefill"):
        print(f"| {name} (prompt_logprobs) | {r[name]:.4f} | {r[name + ' max |dlogprob|']:.2e} |")


if __name__ == "__main__":
    main()
