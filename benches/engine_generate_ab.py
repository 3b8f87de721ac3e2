"""``Engine.generate`` of this tree against the Python package of an earlier commit, same ``_core``.

What it answers: did a change to the Python side of ``Engine`` (e.g. moving its step loop into Rust)
change end-to-end throughput or CPU cost on the bundled model? The baseline is ``python/yoco_rs`` at
``--baseline`` (default ``0b234b1``, the last commit with ``Engine``'s own Python step loop), extracted
with ``git archive`` into a temporary folder and given this tree's built ``_core``; each measurement
runs in its own interpreter, the two alternated ``--rounds`` times per concurrency (noise on a shared
machine hits both), medians reported. Greedy, ``ignore_eos``, one thread; both must produce the same
token ids (asserted), so the comparison is of the same work.

    OMP_NUM_THREADS=1 .venv/bin/python benches/engine_generate_ab.py [--baseline 0b234b1] [--rounds 3]

Columns: tokens/s of each (wall of ``generate``), their ratio (this tree / baseline), and CPU seconds
of the process per 1,000 generated tokens during ``generate``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [(1, 128), (16, 64), (64, 64)]  # (concurrent prompts, new tokens each)


def worker(conc: int, new: int) -> None:
    """One measurement in this interpreter (whichever ``yoco_rs`` is first on the path)."""
    import numpy as np

    import yoco_rs
    from yoco_rs import Engine, SamplingParams

    rng = np.random.default_rng(0)
    prompts = [[2] + rng.integers(10, 2048, size=int(rng.integers(32, 96))).tolist() for _ in range(conc)]
    eng = Engine(max_model_len=1024, max_num_seqs=max(conc, 1))
    p = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    eng.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # warm-up
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    outs = eng.generate(prompts, p, use_tqdm=False)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    ids = [list(o.outputs[0].token_ids) for o in outs]
    n = sum(len(i) for i in ids)
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    print(json.dumps({"tok_s": n / wall, "cpu_per_1k": 1000 * cpu / n, "tokens": n, "ids": digest,
                      "package": str(Path(yoco_rs.__file__).parent)}))


def baseline_package(ref: str, into: Path) -> Path:
    """``python/yoco_rs`` at ``ref`` under ``into``, with this tree's built ``_core``."""
    arc = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "python/yoco_rs"], check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=arc, check=True)
    cores = list((ROOT / "python/yoco_rs").glob("_core*.so"))
    if not cores:
        sys.exit("no built _core in python/yoco_rs: run `make setup` first")
    shutil.copy2(cores[0], into / "python/yoco_rs" / cores[0].name)
    return into / "python"


def run(conc: int, new: int, pythonpath: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, __file__, "--worker", str(conc), str(new)], env=env,
                       capture_output=True, text=True, cwd="/")
    if r.returncode:
        sys.exit(f"worker failed ({'baseline' if pythonpath else 'this tree'}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="0b234b1", help="git ref whose python/yoco_rs is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(*a.worker)
    with tempfile.TemporaryDirectory() as tmp:
        base_path = str(baseline_package(a.baseline, Path(tmp)))
        print(f"baseline: python/yoco_rs at {a.baseline}; this tree: {ROOT}; {a.rounds} alternated rounds")
        print("| concurrency | tokens | baseline tok/s | this tree tok/s | ratio | CPU s / 1k tok, baseline "
              "| CPU s / 1k tok, this tree |")
        print("|---|---|---|---|---|---|---|")
        for conc, new in CASES:
            got: dict[str, list[dict]] = {"base": [], "new": []}
            for _ in range(a.rounds):
                got["base"].append(run(conc, new, base_path))
                got["new"].append(run(conc, new, None))
            assert "/python/yoco_rs" in got["base"][0]["package"] and tmp in got["base"][0]["package"]
            digests = {r["ids"] for side in got.values() for r in side}
            assert len(digests) == 1, f"concurrency {conc}: the token ids differ between the two"
            med = {k: {f: statistics.median(r[f] for r in v) for f in ("tok_s", "cpu_per_1k")}
                   for k, v in got.items()}
            b, n = med["base"], med["new"]
            print(f"| {conc} | {got['new'][0]['tokens']} | {b['tok_s']:.0f} | {n['tok_s']:.0f} | "
                  f"{n['tok_s'] / b['tok_s']:.2f} | {b['cpu_per_1k']:.2f} | {n['cpu_per_1k']:.2f} |")


if __name__ == "__main__":
    main()
