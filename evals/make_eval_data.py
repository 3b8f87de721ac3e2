"""Write the evaluation sets in ``evals/data/`` (committed; rerun to reproduce them).

    .venv/bin/python evals/make_eval_data.py

From the held-out documents (``scripts/default_model_data.py``: ~5% of the docstrings and pydoc topics,
chosen by a hash of their name, never trained on) and the bundled tokenizer:

* ``heldout_text.jsonl``: ``{"name", "text"}`` held-out documents of 200-2000 characters (perplexity, and
  lm-eval's ``loglikelihood_rolling`` task);
* ``recall.jsonl``: the long-context retrieval set: ``{"id", "multiple", "context_id", "prompt", "answer",
  "choices"}``; prompts of about 2x, 4x and 8x the sliding window (128, 256, 512 tokens), each asked fact
  more than a window before the question, two questions per context (so prompts share a long prefix and
  prefix caching has something to reuse); ``choices`` holds the answer and 3 other values of the same
  context (lm-eval's multiple-choice form).
"""

from __future__ import annotations

import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import default_model_data as data  # noqa: E402

WINDOW = 64
MULTIPLES = (2, 4, 8)
CONTEXTS_PER_MULTIPLE = 40


def main() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(ROOT, "python", "yoco_rs", "default_model", "tokenizer.json"))
    count = lambda s: len(tok.encode(s, add_special_tokens=False).ids)  # noqa: E731
    docs = data.documents("heldout")
    keys, values = data.task_words(tok)
    out = os.path.join(HERE, "data")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "heldout_text.jsonl"), "w") as f:
        for name, text in docs:
            if 200 <= len(text) <= 2000:
                f.write(json.dumps({"name": name, "text": text}) + "\n")
    rng = random.Random(20261201)
    n = 0
    with open(os.path.join(out, "recall.jsonl"), "w") as f:
        for m in MULTIPLES:
            made = 0
            while made < CONTEXTS_PER_MULTIPLE:
                query_len = 8
                ep = data.recall_episode(rng, docs, m * WINDOW - query_len, count, keys, values, n_queries=2,
                                         far_from=WINDOW)
                if ep is None or len(ep[1]) < 2:
                    continue
                ctx, asked = ep
                ctx_values = [v for v in values if f" = {v}\n" in ctx]
                for k, v in asked:
                    others = sorted(set(ctx_values) - {v})
                    if len(others) < 3:
                        others += [w for w in values if w != v and w not in others][: 3 - len(others)]
                    choices = [v] + rng.sample(others, 3)
                    rng.shuffle(choices)
                    f.write(json.dumps({"id": n, "multiple": m, "context_id": f"{m}x-{made}",
                                        "prompt": ctx + data.recall_query(k), "answer": v,
                                        "choices": choices, "label": choices.index(v)}) + "\n")
                    n += 1
                made += 1
    print(f"wrote {out}: {n} recall questions, held-out texts")


if __name__ == "__main__":
    main()
