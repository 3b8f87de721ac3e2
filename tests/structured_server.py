"""The live yoco-serve of the structured-output and tool-calling tests, on each front end: auto tool choice
on (pythonic parser), compact JSON (``disable_any_whitespace``: a random-weight model otherwise spends its
token budget on blanks), a 2 s compile budget. Shared by tests/test_structured_serve.py and
tests/test_tools_serve.py as a module fixture parametrized over ``FRONTENDS``; its teardown stops it."""

from __future__ import annotations

import json

from serve_helpers import FRONTENDS, CliServer

ENGINE = dict(max_model_len=1024, kv_cache_memory=128 << 20, max_num_seqs=32, seed=0,
              structured_outputs_config={"disable_any_whitespace": True, "time_budget_ms": 2000})
#: The same server as ``yoco-serve`` flags (the Rust front end).
RUST_FLAGS = ("--frontend", "rust", "--max-model-len", str(ENGINE["max_model_len"]), "--kv-cache-memory", "128MiB",
              "--max-num-seqs", str(ENGINE["max_num_seqs"]), "--seed", "0", "--served-model-name", "yoco-tiny",
              "--structured-outputs-config", json.dumps(ENGINE["structured_outputs_config"]),
              "--enable-auto-tool-choice", "--tool-call-parser", "pythonic")
PARAMS = FRONTENDS


def structured_fixture(request):
    """A module fixture's body (``params=PARAMS``): this front end's structured server."""
    s = CliServer(*RUST_FLAGS)
    yield s
    s.stop()
