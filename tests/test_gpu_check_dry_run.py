"""The GPU scripts run on a GPU only when a session is lent one, so their imports and glue rot unseen (on
2026-12-04 the first GPU run found ``kernels/check.py`` importing a module that had moved). Their dry runs
exercise them on the CPU: ``gpu_check.sh`` (every section but the slow greedy one, tiny shapes),
``gpu_profile_decode.py`` (tiny model, graph replay) and ``gpu_engine_e2e.py`` (``Engine`` and
``yoco-serve`` with ``E2E_DEVICE=cpu``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_check_dry_run_completes_every_section_and_writes_its_summary(tmp_path):
    out = tmp_path / "summary.json"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path), GPU_CHECK_TIMEOUT="300")
    proc = subprocess.run(["bash", "benches/gpu_check.sh", "--dry-run", "--skip", "2", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["kernels_correct"] is True
    assert "errors" not in s
    assert set(s["section_seconds"]) == {"1", "3", "4", "5"}
    assert set(s["decode_latency"]) == {"1", "2"} and set(s["ttft"]) == {"24", "64"}
    assert all(r["same_first_token"] for r in s["ttft"].values())
    assert s["decode_attention_bandwidth"]["all"]


def _run(args, **env):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.join(ROOT, p) for p in ("python", "tests", "kernels", "benches")),
             **env)
    proc = subprocess.run([sys.executable] + args, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_gpu_profile_decode_dry_run_measures_every_variant_and_compares_their_logits():
    out = _run(["benches/gpu_profile_decode.py", "--dry-run"])
    for variant in ("torch forms", "Triton RMSNorm", "all fusions"):
        assert f"{variant}, batch 1: step wall" in out and f"{variant}, batch 2: step wall" in out
    assert out.count("first decode step's logits") == 4


def test_gpu_engine_e2e_runs_its_three_parts_on_the_cpu():
    out = _run(["benches/gpu_engine_e2e.py"], E2E_DEVICE="cpu")
    assert "gpu_engine_e2e: OK" in out and "RAISED" not in out
    assert out.count("vs cpu fp32: IDENTICAL") == 4 and "completion in" in out
