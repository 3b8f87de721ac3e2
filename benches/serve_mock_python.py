"""``yoco-serve`` (the Python/FastAPI server) with a zero-cost executor, for the serving ceiling
benchmark (``benches/serve_ceiling.py``): the model's forward is replaced by a mock that returns
ready logits (optionally after sleeping ``--forward-ms`` outside the GIL, like a device), so what
remains is the serving stack: HTTP, validation, the engine loop, sampling on the CPU, text.

    .venv/bin/python benches/serve_mock_python.py [--forward-ms 5] -- <yoco-serve flags>
"""

from __future__ import annotations

import sys
import time

import torch

import yoco_rs.engine as engine_mod
from yoco_rs.serve import cli


class ReadyLogits:
    """Logits whose argmax cycles through ordinary tokens (so the detokenizer has work)."""

    def __init__(self, vocab: int, rows: int, forward_s: float):
        self.table = torch.full((rows + 16, vocab), -5.0)
        for i in range(rows + 16):
            self.table[i, 300 + (i * 7) % 1500] = 5.0
        self.calls = 0
        self.forward_s = forward_s

    def execute(self, batch):
        if self.forward_s:
            time.sleep(self.forward_s)  # releases the GIL, as a device would
        k = self.calls % 16
        self.calls += 1
        return self.table[k: k + batch.num_cross]


def main() -> int:
    argv = sys.argv[1:]
    forward_ms = 0.0
    if argv[:1] == ["--forward-ms"]:
        forward_ms, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    real = engine_mod.build_runtime

    def build(cfg, **kw):
        rt = real(cfg, **kw)
        rt.runner = ReadyLogits(rt.vocab_size, rt.config.max_num_seqs, forward_ms * 1e-3)
        return rt

    engine_mod.build_runtime = build
    return cli.main(["--frontend", "python", *argv])  # the FastAPI server (no longer the default)


if __name__ == "__main__":
    sys.exit(main())
