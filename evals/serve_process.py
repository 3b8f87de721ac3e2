"""A ``yoco-serve`` subprocess for the evaluations: the command users run, on a free local port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def yoco_serve(*flags: str, timeout: float = 300.0):
    """Start ``yoco-serve FLAGS --port P`` (the bundled model unless a MODEL_DIR is among the flags),
    wait until /health answers, yield its base URL (``http://127.0.0.1:P``); SIGTERM on exit."""
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "yoco-serve")
    cmd = [exe, *flags, "--port", str(port), "--disable-progress", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"yoco-serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"yoco-serve did not become healthy in {timeout}s")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


__all__ = ["yoco_serve", "free_port"]
