"""A live yoco-serve for tests: the real ``yoco-serve`` (the Rust front end driving the PyTorch executor of
the bundled tiny model) as a subprocess on a free 127.0.0.1 port. One shared instance per test process
(loading takes seconds); tests that need other settings start their own.

``FRONTENDS`` is the one front end, ``("rust",)``: the black-box suites (hostile input, bad input,
fuzzing, the openai client, load, metrics) were parametrized over two front ends until the FastAPI one
was retired, and keep their ``[rust]`` test ids."""

from __future__ import annotations

import os
import time
from typing import Optional

import httpx
from prometheus_client.parser import text_string_to_metric_families

from yoco_rs.serve.child_server import ChildServer

API_KEY = "test-key"
SHARED_ENGINE = dict(max_model_len=256, kv_cache_memory=64 << 20, max_num_seqs=32, seed=0)
SHARED_LIMIT = 1 << 20  # request body bytes
FRONTENDS = ("rust",)
_shared: dict = {}


def shared_server(frontend: str = "rust"):
    """The process-wide server: API key ``test-key``, 1 MiB body limit, max_model_len 256, served as
    ``yoco-tiny`` and ``tiny-alias``. Test modules use it through a session-scoped fixture; the session's
    end (``conftest``'s ``pytest_sessionfinish``) stops it."""
    assert frontend == "rust", frontend
    if frontend not in _shared:
        _shared[frontend] = RustServer(
            "--max-model-len", "256", "--kv-cache-memory", str(SHARED_ENGINE["kv_cache_memory"]),
            "--max-num-seqs", "32", "--seed", "0", "--api-key", API_KEY,
            "--max-request-body-bytes", str(SHARED_LIMIT), "--served-model-name", "yoco-tiny", "tiny-alias")
    return _shared[frontend]


def stop_shared() -> None:
    while _shared:
        _shared.popitem()[1].stop()


def shared_fixture():
    s = shared_server()
    yield s
    stop_shared()


def each_frontend(request):
    """A session fixture's body, parametrized over ``FRONTENDS``: the shared server."""
    return shared_server(request.param)


class CliServer(ChildServer):
    """A real ``yoco-serve`` subprocess on a free port (``--port 0``; the URL comes from its ready line),
    started from the venv's console script as a user would."""

    def __init__(self, *flags: str, env: Optional[dict] = None, timeout: float = 180.0,
                 command: Optional[list] = None):
        import sys

        exe = command or [os.path.join(os.path.dirname(sys.executable), "yoco-serve")]
        super().__init__(None, flags, env={"OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout, command=exe,
                         keep_lines=1_000_000)



class RustServer(CliServer):
    """``yoco-serve`` as a subprocess with the tests' interface (``url``, ``headers``, ``metrics``,
    ``metric``, ``wait_idle``, ``alive``, ``stop``): black-box only."""

    def __init__(self, *flags: str, api_key: Optional[str] = API_KEY, command: Optional[list] = None):
        import types
        super().__init__("--frontend", "rust", *flags, command=command)
        self.port = int(self.url.rsplit(":", 1)[-1])
        self.settings = types.SimpleNamespace(api_keys=[api_key] if api_key else [])

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.settings.api_keys[0]}"} if self.settings.api_keys else {}

    def metrics(self) -> dict:
        """{(name, frozenset(labels minus model_name/engine)): value}, summed over the step loops."""
        out: dict = {}
        for fam in text_string_to_metric_families(httpx.get(self.url + "/metrics", timeout=10).text):
            for s in fam.samples:
                labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))
                out[(s.name, labels)] = out.get((s.name, labels), 0) + s.value
        return out

    def metric(self, name: str, **labels) -> float:
        return self.metrics().get((name, frozenset(labels.items())), 0.0)

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """Wait until no request runs or waits and no KV block is referenced; returns the metrics."""
        deadline = time.monotonic() + timeout
        busy: list = []
        while time.monotonic() < deadline:
            m = self.metrics()
            busy = [m.get((n, frozenset()), 0) for n in
                    ("yoco:num_requests_running", "yoco:num_requests_waiting", "yoco:kv_blocks_used")]
            if not any(busy):
                return m
            time.sleep(0.05)
        raise AssertionError(f"server not idle after {timeout} s: running/waiting/blocks_used = {busy}")

    def alive(self) -> bool:
        return self.proc.poll() is None and httpx.get(self.url + "/health", timeout=10).status_code == 200

    def stop(self) -> None:
        ChildServer.stop(self)
