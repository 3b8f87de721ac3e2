"""A live yoco-serve for tests: the real ``AsyncEngine`` on the bundled tiny model behind uvicorn, in a
background thread, on a socket bound to a free 127.0.0.1 port. One shared instance per test process
(loading takes seconds); tests that need other settings start their own."""

from __future__ import annotations

import socket
import threading
import time
from typing import Optional

import httpx
from prometheus_client.parser import text_string_to_metric_families

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
            if not any(busy) and self.engine.num_unfinished_requests == 0:
                return m
            time.sleep(0.05)
        raise AssertionError(f"server not idle after {timeout} s: running/waiting/blocks_used = {busy}, "
                             f"unfinished streams = {self.engine.num_unfinished_requests}")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


_shared: Optional[LiveServer] = None


def shared_server() -> LiveServer:
    """The process-wide server: API key ``test-key``, 1 MiB body limit, max_model_len 256. Test modules
    use it through a session-scoped fixture whose teardown calls ``stop_shared`` (before interpreter
    exit, when the engine's shutdown can still use worker threads)."""
    global _shared
    if _shared is None:
        _shared = LiveServer(api_keys=[API_KEY], max_request_body_bytes=SHARED_LIMIT,
                             served_model_names=["yoco-tiny", "tiny-alias"])
    return _shared


def stop_shared() -> None:
    global _shared
    if _shared is not None:
        _shared.stop()
        _shared = None


def shared_fixture():
    s = shared_server()
    yield s
    stop_shared()


class CliServer:
    """A real ``yoco-serve`` subprocess on a free port (``--port 0``; the URL comes from its ready line)."""

    def __init__(self, *flags: str, env: Optional[dict] = None, timeout: float = 180.0):
        import os
        import subprocess
        import sys

        exe = os.path.join(os.path.dirname(sys.executable), "yoco-serve")
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen([exe, "--port", "0", "--disable-progress", *flags], stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True, env=full_env)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = None
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(timeout) or self.url is None:
            self.kill()
            raise RuntimeError("yoco-serve did not print its ready line:\n" + "".join(self.lines))

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("yoco-serve ready:"):
                self.url = line.strip().rsplit(" ", 1)[-1]
                self._ready.set()
        self._ready.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
