"""Run the pytest suite as N concurrent pytest processes ("shards"), each over its own test files.

Why: every test process runs torch on one thread (``tests/conftest.py``), and much of the suite waits on
subprocess servers, sockets and sleeps, so one pytest process leaves the CI box's second core mostly idle.
Two shards over disjoint files take about half the wall time; nothing is shared between them except the
machine (each has its own ``--basetemp``; servers bind ephemeral ports).

How files are split: the files that share a session-scoped fixture stay in one shard, so it is built once
(the shared servers of ``serve_helpers.shared_server``, the tiny multimodal checkpoint ``tiny_mm``).
Units are then assigned longest first to the least loaded shard, by the seconds each file took in the
last recorded run (``tests/shard_weights.json``; ``--write-weights`` refreshes it from this run), or
``DEFAULT_SECONDS`` for a file not recorded.

Usage (``make test-python`` calls it; extra arguments go to every pytest)::

    python scripts/pytest_shards.py [--shards N] [--write-weights] [pytest args...]

With ``--shards 1``, or when the arguments name test paths or node ids, it runs one plain pytest instead.
Each shard's output is printed whole when it ends (so the log reads as N ordinary pytest runs), then the
per-file times; the exit status is non-zero when any shard failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
WEIGHTS = TESTS / "shard_weights.json"
DEFAULT_SECONDS = 15.0
# A file mentioning one of these uses a session-scoped fixture that is built once per process.
SHARED_FIXTURES = ("shared_server(", "shared_fixture", "each_frontend", "tiny_mm")


def test_files() -> list[str]:
    return sorted(p.name for p in TESTS.glob("test_*.py"))


def units(files: list[str]) -> list[list[str]]:
    """The files as units kept in one process: one unit per shared fixture, the rest one file each."""
    groups: dict[str, list[str]] = {}
    alone = []
    for f in files:
        text = (TESTS / f).read_text(encoding="utf-8")
        key = next((k for k in SHARED_FIXTURES if k in text), None)
        if key is None:
            alone.append([f])
        else:
            groups.setdefault("shared" if key != "tiny_mm" else key, []).append(f)
    return list(groups.values()) + alone


def assign(files: list[str], shards: int, weights: dict[str, float]) -> list[list[str]]:
    """Longest unit first onto the least loaded shard."""
    cost = lambda u: sum(weights.get(f, DEFAULT_SECONDS) for f in u)  # noqa: E731
    out: list[list[str]] = [[] for _ in range(shards)]
    load = [0.0] * shards
    for u in sorted(units(files), key=cost, reverse=True):
        i = load.index(min(load))
        out[i].extend(u)
        load[i] += cost(u)
    return [sorted(s) for s in out if s]


def file_seconds(junit: Path) -> dict[str, float]:
    """Seconds per test file from a JUnit XML report (its testcases' ``classname`` is ``tests.test_x``)."""
    out: dict[str, float] = {}
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        mod = case.get("classname", "").split(".")
        name = next((m for m in mod if m.startswith("test_")), None)
        if name:
            out[name + ".py"] = out.get(name + ".py", 0.0) + float(case.get("time", 0) or 0)
    return out


def names_paths(args: list[str]) -> bool:
    """Whether the pytest arguments select tests themselves (paths or node ids): then do not shard."""
    return any(not a.startswith("-") and ("::" in a or (ROOT / a).exists() or Path(a).exists()) for a in args)


def main(argv: list[str]) -> int:
    shards, write = 2, False
    args: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--shards":
            shards = int(next(it))
        elif a.startswith("--shards="):
            shards = int(a.split("=", 1)[1])
        elif a == "--write-weights":
            write = True
        else:
            args.append(a)
    pytest = [sys.executable, "-m", "pytest"]
    if shards <= 1 or names_paths(args):
        return subprocess.call(pytest + args, cwd=ROOT)

    weights = json.loads(WEIGHTS.read_text()) if WEIGHTS.exists() else {}
    plan = assign(test_files(), shards, weights)
    tmp = Path(tempfile.mkdtemp(prefix="yoco-shards-"))
    procs = []
    t0 = time.monotonic()
    for i, files in enumerate(plan):
        log = open(tmp / f"shard{i}.log", "w")
        cmd = pytest + ["-p", "no:cacheprovider", f"--basetemp={tmp / f'base{i}'}",
                        f"--junitxml={tmp / f'shard{i}.xml'}", *args, *(f"tests/{f}" for f in files)]
        procs.append((i, files, log, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                                      env={**os.environ, "YOCO_TEST_SHARD": str(i)})))
        est = sum(weights.get(f, DEFAULT_SECONDS) for f in files)
        print(f"pytest shard {i}: {len(files)} files (about {est:.0f} s by the last recorded run)", flush=True)
    status = 0
    pending = list(procs)
    while pending:
        for p in list(pending):
            i, files, log, proc = p
            rc = proc.poll()
            if rc is None:
                continue
            pending.remove(p)
            log.close()
            print(f"\n===== pytest shard {i} ended (exit {rc}) after {time.monotonic() - t0:.0f} s: "
                  f"{' '.join(files)}", flush=True)
            sys.stdout.write((tmp / f"shard{i}.log").read_text(errors="replace"))
            sys.stdout.flush()
            status = status or rc
        time.sleep(0.5)

    seconds: dict[str, float] = {}
    for i in range(len(plan)):
        seconds.update(file_seconds(tmp / f"shard{i}.xml"))
    totals = [sum(seconds.get(f, 0.0) for f in files) for files in plan]
    print(f"\npytest shards: {len(plan)} in {time.monotonic() - t0:.0f} s wall; test time per shard "
          + ", ".join(f"{t:.0f} s" for t in totals) + "; slowest files: "
          + ", ".join(f"{f} {s:.0f} s" for f, s in sorted(seconds.items(), key=lambda x: -x[1])[:8]), flush=True)
    if write and seconds:
        WEIGHTS.write_text(json.dumps({f: round(s, 1) for f, s in sorted(seconds.items())}, indent=1) + "\n")
        print(f"pytest shards: wrote {WEIGHTS.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
