"""A live yoco-serve for tests: the real ``AsyncEngine`` on the bundled tiny model behind uvicorn, in a
background thread, on a socket bound to a free 127.0.0.1 port; or the Rust front end
(``--frontend rust``) as a subprocess with the same settings. One shared instance of each per test
process (loading takes seconds); tests that need other settings start their own.

The black-box suites (hostile input, bad input, fuzzing, the openai client, load, metrics) run against
both front ends (``each_frontend``): they are the contract the Rust server must meet before the FastAPI
one is retired. ``YOCO_TEST_FRONTENDS=python`` (or ``rust``) runs one."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Optional

import httpx
from prometheus_client.parser import text_string_to_metric_families

from yoco_rs.serve.child_server import ChildServer

API_KEY = "test-key"
SHARED_ENGINE = dict(max_model_len=256, kv_cache_memory=64 << 20, max_num_seqs=32, seed=0)
SHARED_LIMIT = 1 << 20  # request body bytes


def free_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


class LiveServer:
    def __init__(self, engine_kwargs: Optional[dict] = None, app_kwargs: Optional[dict] = None, *,
                 model: Optional[str] = None, **settings):
        import uvicorn

        from yoco_rs import AsyncEngine
        from yoco_rs.serve import ServerSettings, create_app

        self.engine = AsyncEngine(model, **(engine_kwargs if engine_kwargs is not None else SHARED_ENGINE))
        self.settings = ServerSettings(**settings)
        self.app = create_app(self.engine, self.settings, **(app_kwargs or {}))
        sock = free_socket()
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name="yoco-serve-test")
        self.thread.start()
        self.wait_healthy()

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.settings.api_keys[0]}"} if self.settings.api_keys else {}

    def wait_healthy(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if not self.thread.is_alive():
                raise RuntimeError("the test server thread exited")
            time.sleep(0.1)
        raise TimeoutError("yoco-serve did not become healthy")

    def metrics(self) -> dict:
        """{(name, frozenset(labels minus model_name/engine)): value} of every sample."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))
                out[(s.name, labels)] = s.value
        return out

    def metric(self, name: str, **labels) -> float:
        return self.metrics().get((name, frozenset(labels.items())), 0.0)

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """Wait until no request runs or waits and no KV block is referenced; returns the metrics."""
        deadline = time.monotonic() + timeout
        m = {}
        while time.monotonic() < deadline:
            m = self.metrics()
            busy = [m.get((n, frozenset()), 0) for n in
                    ("yoco:num_requests_running", "yoco:num_requests_waiting", "yoco:kv_blocks_used")]
            if not any(busy) and (self.engine is None or self.engine.num_unfinished_requests == 0):
                return m
            time.sleep(0.05)
        streams = "" if self.engine is None else f", unfinished streams = {self.engine.num_unfinished_requests}"
        raise AssertionError(f"server not idle after {timeout} s: running/waiting/blocks_used = {busy}{streams}")

    def alive(self) -> bool:
        """The engine still serves (a bad request did not kill it)."""
        return not self.engine.is_dead

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


FRONTENDS = tuple(os.environ.get("YOCO_TEST_FRONTENDS", "python,rust").split(","))
_shared: dict = {}


def shared_server(frontend: str = "python"):
    """The process-wide server of ``frontend``: API key ``test-key``, 1 MiB body limit, max_model_len 256,
    served as ``yoco-tiny`` and ``tiny-alias``. Test modules use it through a session-scoped fixture
    whose teardown calls ``stop_shared`` (before interpreter exit, when the engine's shutdown can still
    use worker threads)."""
    if frontend not in _shared:
        if frontend == "python":
            _shared[frontend] = LiveServer(api_keys=[API_KEY], max_request_body_bytes=SHARED_LIMIT,
                                           served_model_names=["yoco-tiny", "tiny-alias"])
        else:
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
    """A session fixture's body, parametrized over ``FRONTENDS``: the shared server of each front end.
    The servers stay up until the session ends (``conftest``'s ``pytest_sessionfinish``)."""
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
    """``yoco-serve --frontend rust`` as a subprocess, with ``LiveServer``'s test interface (``url``,
    ``headers``, ``metrics``, ``wait_idle``, ``alive``, ``stop``); ``engine`` is None (black-box only)."""

    engine = None

    def __init__(self, *flags: str, api_key: Optional[str] = API_KEY, command: Optional[list] = None):
        import types
        super().__init__("--frontend", "rust", *flags, command=command)
        self.port = int(self.url.rsplit(":", 1)[-1])
        self.settings = types.SimpleNamespace(api_keys=[api_key] if api_key else [])

    headers = LiveServer.headers
    metric = LiveServer.metric

    def metrics(self) -> dict:
        """{(name, frozenset(labels minus model_name/engine)): value}, summed over the step loops."""
        out: dict = {}
        for fam in text_string_to_metric_families(httpx.get(self.url + "/metrics", timeout=10).text):
            for s in fam.samples:
                labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))
                out[(s.name, labels)] = out.get((s.name, labels), 0) + s.value
        return out

    def alive(self) -> bool:
        return self.proc.poll() is None and httpx.get(self.url + "/health", timeout=10).status_code == 200

    wait_idle = LiveServer.wait_idle  # engine is None: the gauges alone

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except Exception:
                self.kill()
