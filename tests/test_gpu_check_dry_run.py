"""``benches/gpu_check.sh`` is run on a GPU only when a session is lent one, so its imports and glue rot
unseen (on 2026-12-04 its first GPU run found ``kernels/check.py`` importing a module that had moved).
The dry run exercises every section but the slow greedy one with tiny shapes on the CPU."""

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
