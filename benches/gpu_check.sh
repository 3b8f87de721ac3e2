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
#
# On a GPU it then runs the two companions (GPU_CHECK_EXTRAS=0 skips them), each under its own timeout,
# their logs in $OUT: benches/gpu_profile_decode.py (where a decode step's time goes, ~1 min) and
# benches/gpu_engine_e2e.py (Engine and yoco-serve on CUDA, ~1 min; it needs the compiled _core: build it,
# or carry a stripped copy, `strip -o X python/yoco_rs/_core.abi3.so`, and copy it into python/yoco_rs/).
# The whole set took about 4 minutes of an H200 on 2026-12-04. Exits non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="python:tests${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export OUT="${OUT:-/tmp}"
rc=0
timeout "${GPU_CHECK_TIMEOUT:-900}" "$PY" benches/gpu_check.py "$@" || rc=$?
if [[ "${GPU_CHECK_PYTEST:-0}" == "1" ]]; then
  timeout 600 "$PY" -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py tests/test_kernels_kv.py \
    tests/test_kernels_backend.py tests/test_kernels_rms_norm.py tests/test_kernels_layer_elementwise.py \
    tests/test_graph_runner_triton.py tests/test_graph_runner_gemma.py || rc=$?
fi
if [[ " $* " != *" --dry-run "* && "${GPU_CHECK_EXTRAS:-1}" == "1" ]] \
    && "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo; echo "== gpu_profile_decode.py (log: $OUT/gpu_profile_decode.log)"
  PYTHONPATH="python:tests:kernels:benches" timeout 300 "$PY" benches/gpu_profile_decode.py \
    > "$OUT/gpu_profile_decode.log" 2>&1 || rc=$?
  grep -E "^device|kernels per step|^batch|logits" "$OUT/gpu_profile_decode.log"
  echo; echo "== gpu_engine_e2e.py (log: $OUT/gpu_engine_e2e.log)"
  if "$PY" -c "import yoco_rs._core" 2>/dev/null; then
    timeout 300 "$PY" benches/gpu_engine_e2e.py 2>&1 | tr '\r' '\n' \
      | grep -v "Processed prompts\|Capturing CUDA\|Loading weights" > "$OUT/gpu_engine_e2e.log" || rc=$?
    grep -vE "^\s*$" "$OUT/gpu_engine_e2e.log" | tail -25
  else
    echo "  skipped: yoco_rs._core is not built here (see the header of this script)"
  fi
fi
exit $rc
