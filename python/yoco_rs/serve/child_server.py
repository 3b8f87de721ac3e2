"""A ``yoco-serve`` child process on a free loopback port: what a Ray replica runs (and what the serve tests
start). The child binds ``--port 0`` itself, so there is no race for a port chosen in advance; its ready
line ends with the URL it serves on, which is how the parent learns it.

The child's stderr is read on a thread for the whole of its life (a full pipe would block the server's
logging) and kept, bounded, for error messages."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
from typing import Optional, Sequence

#: The line ``yoco-serve`` prints once it serves; its last word is the URL.
READY_PREFIX = "yoco-serve ready:"


def serve_command() -> list[str]:
    """``yoco-serve`` under this interpreter (no console script on ``PATH`` needed)."""
    return [sys.executable, "-c", "import sys; from yoco_rs.serve.cli import main; sys.exit(main())"]


class ChildServer:
    """``yoco-serve [model] --host 127.0.0.1 --port 0 --disable-progress *args`` until ``stop``.

    Raises ``RuntimeError`` with the child's output when it exits (a bad flag, a model that does not
    load) or prints no ready line within ``timeout`` seconds."""

    def __init__(self, model: Optional[str], args: Sequence[str] = (), *, env: Optional[dict] = None,
                 timeout: float = 300.0, command: Optional[list[str]] = None, keep_lines: int = 2000) -> None:
        argv = [*(command or serve_command()), *([model] if model else []), "--host", "127.0.0.1", "--port", "0",
                "--disable-progress", *args]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        self.lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.url: Optional[str] = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True, name="yoco-serve-stderr").start()
        if not self._ready.wait(timeout) or self.url is None:
            self.kill()
            raise RuntimeError(f"yoco-serve did not print its ready line:\n{self.log}")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if self.url is None and line.startswith(READY_PREFIX):
                self.url = line.strip().rsplit(" ", 1)[-1]
                self._ready.set()
        self._ready.set()  # the child exited: stop waiting

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def log_tail(self, n: int = 40) -> str:
        return "".join(list(self.lines)[-n:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """SIGTERM (the server drains), then SIGKILL after ``timeout`` seconds; the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


__all__ = ["ChildServer", "READY_PREFIX", "serve_command"]
