"""Grammar mask time per row (µs) for JSON-schema grammars at 1 / 64 / 256 rows, on the bundled
tokenizer and on a 262,144-token Gemma-like tokenizer (byte fallback, ``▁`` spaces) built here with
``tokenizers``. Rows are masked in parallel (rayon, GIL released): one ``MatcherTable.masks`` call per
step over all rows; rows walk forward through the grammar (each step every row takes a random allowed
token), so the masks are of real, changing states, not one cached state. Anchor: llguidance publishes
~50 µs per mask at a 128k vocabulary; target <= 50 µs per row at 262k with rows in parallel.

Two figures per row: *wall* µs per row (a step's wall time over its rows: what a step waits, so it
shrinks with more cores) and *CPU* µs per row (the process's CPU time over the step, all threads,
divided by the rows: the work one mask costs, whatever the cores). On a machine with C free cores the
wall figure approaches CPU / C; on a shared box it says how loaded the box was as much as how fast the
masks are. Each sequence forks its own matcher (its own lexer cache) from its grammar's warm template,
so rows of one grammar run in parallel.

    YOCO_GRAMMAR_THREADS=2 .venv/bin/python benches/structured_mask.py [--steps 30]

(``YOCO_GRAMMAR_THREADS``: the grammar pool's size; by default one fewer than the cores, which leaves
the engine loop a core; a bench of masks alone may use them all.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import tempfile
import time

import numpy as np
from tokenizers import Tokenizer

from yoco_rs import _core, bundled

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                      "email": {"type": "string", "format": "email"},
                                      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                                      "role": {"enum": ["admin", "user", "guest"]}},
     "required": ["name", "age", "email", "tags", "role"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                "score": {"type": "number"},
                                                                "ok": {"type": "boolean"}},
                                "required": ["id", "score", "ok"], "additionalProperties": False},
     "minItems": 1, "maxItems": 50},
]


def gemma_like_tokenizer(path: str, vocab: int = 262_144, seed: int = 0) -> str:
    """The bundled tokenizer's pipeline (byte fallback, ``▁`` for spaces) with ``vocab`` tokens: its own
    vocabulary first, then random word pieces (ASCII letters and digits, punctuation, some CJK and
    accented letters; half start with ``▁``)."""
    src = json.loads((bundled._SRC / "tokenizer.json").read_text())
    v = dict(src["model"]["vocab"])
    rng = random.Random(seed)
    alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 4 + ".,;:!?-_'\"(){}[]<>/=+*&%$#@" \
        + "éèàüößçñ" + "的一是不了人我在有他这中大来上"
    while len(v) < vocab - len(src["added_tokens"]):
        n = max(1, min(12, int(rng.expovariate(1 / 5))))
        t = ("▁" if rng.random() < 0.5 else "") + "".join(rng.choice(alpha) for _ in range(n))
        if t not in v:
            v[t] = len(v)
    src["model"]["vocab"] = v
    src["model"]["merges"] = []
    tok = Tokenizer.from_str(json.dumps(src))
    tok.save(path)
    assert tok.get_vocab_size(with_added_tokens=True) >= vocab - 8
    return path


def bench(tokenizer_json: str, rows_list, steps: int) -> list[dict]:
    tok = Tokenizer.from_file(tokenizer_json)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos = [i for i in (tok.token_to_id("<eos>"), tok.token_to_id("<end_of_turn>")) if i is not None]
    comp = _core.GrammarCompiler(tokenizer_json, vocab, eos)
    grams = [comp.compile("json", json.dumps({**s, "x-guidance": {"whitespace_flexible": False}})) for s in SCHEMAS]
    rng = np.random.default_rng(0)
    out = []
    for rows in rows_list:
        table = _core.MatcherTable(vocab, eos)
        ids = np.arange(1, rows + 1, dtype=np.uint64)
        for i in ids.tolist():
            table.add(i, grams[i % len(grams)])
        times, cpu = [], []
        for step in range(steps):
            t, c = time.perf_counter(), time.process_time()
            r, bm, _ = table.masks(ids)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            bits = np.unpackbits(bm.view(np.uint8), bitorder="little").reshape(rows, -1)[:, :vocab]
            toks = np.zeros(rows, dtype=np.int32)
            for k in range(rows):
                allowed = np.flatnonzero(bits[k])
                nonend = np.setdiff1d(allowed, eos)
                toks[k] = rng.choice(nonend) if len(nonend) else allowed[0]
            table.advance(ids, toks)
            for k in range(rows):  # a finished row starts again
                if not len(np.setdiff1d(np.flatnonzero(bits[k]), eos)):
                    i = int(ids[k])
                    table.remove(i)
                    table.add(i, grams[i % len(grams)])
        ts, cs = np.array(times[2:]), np.array(cpu[2:])  # the first masks fork the rows and build lexer states
        out.append({"rows": rows, "step_ms_p50": 1e3 * float(np.median(ts)),
                    "us_per_row_p50": 1e6 * float(np.median(ts)) / rows,
                    "us_per_row_mean": 1e6 * float(ts.mean()) / rows,
                    "cpu_us_per_row_p50": 1e6 * float(np.median(cs)) / rows,
                    "cpu_us_per_row_mean": 1e6 * float(cs.mean()) / rows,
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    a = ap.parse_args()
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()}")
    print("| tokenizer | rows | step p50 (ms) | wall µs/row p50 | wall µs/row mean | CPU µs/row p50 "
          "| CPU µs/row mean | peak RSS so far (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        big = gemma_like_tokenizer(os.path.join(d, "tokenizer.json"))
        for name, path in (("bundled (4,096)", str(bundled._SRC / "tokenizer.json")), ("gemma-like 262,144", big)):
            for r in bench(path, a.rows, a.steps):
                print(f"| {name} | {r['rows']} | {r['step_ms_p50']:.3f} | {r['us_per_row_p50']:.1f} | "
                      f"{r['us_per_row_mean']:.1f} | {r['cpu_us_per_row_p50']:.1f} | {r['cpu_us_per_row_mean']:.1f} | "
                      f"{r['peak_rss_mb']:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
