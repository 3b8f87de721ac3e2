#!/usr/bin/env bash
# The GPU check (kernels, graphs vs eager, decode latency, fast-prefill TTFT, attention bandwidth).
# Needs only this checkout and the machine's own PyTorch + Triton: nothing is built or installed
# (the compiled Rust core is not used). About 70 s on an H200 (2026-12-04; 5 sections, each capped by
# GPU_CHECK_SECTION_LIMIT seconds, default 240, and reported if it raises while the others still run).
#
#   benches/gpu_check.sh                  # on a GPU
#   benches/gpu_check.sh --dry-run        # on a CPU: exercises every section with tiny shapes
#   benches/gpu_check.sh --json out.json  # also write the figures
#   GPU_CHECK_PYTEST=1 benches/gpu_check.sh   # then also run the kernel/graph pytest files on the GPU
#                                              (test_graph_runner_gemma.py needs the compiled _core)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="python:tests${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export OUT="${OUT:-/tmp}"
timeout "${GPU_CHECK_TIMEOUT:-900}" "$PY" benches/gpu_check.py "$@"
if [[ "${GPU_CHECK_PYTEST:-0}" == "1" ]]; then
  timeout 600 "$PY" -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py tests/test_kernels_kv.py \
    tests/test_kernels_backend.py tests/test_kernels_rms_norm.py tests/test_graph_runner_triton.py tests/test_graph_runner_gemma.py
fi
