"""One live yoco-serve for the structured-output and tool-calling tests: auto tool choice on (pythonic
parser), compact JSON (``disable_any_whitespace``: a random-weight model otherwise spends its token
budget on blanks), a 2 s compile budget. Shared by tests/test_structured_serve.py and
tests/test_tools_serve.py; the fixture's teardown stops it."""

from __future__ import annotations

from typing import Optional

from serve_helpers import LiveServer

ENGINE = dict(max_model_len=1024, kv_cache_memory=128 << 20, max_num_seqs=32, seed=0,
              structured_outputs_config={"disable_any_whitespace": True, "time_budget_ms": 2000})
_srv: Optional[LiveServer] = None


def structured_fixture():
    global _srv
    if _srv is None:
        _srv = LiveServer(engine_kwargs=ENGINE, enable_auto_tool_choice=True, tool_call_parser="pythonic")
    yield _srv
    _srv.stop()
    _srv = None
