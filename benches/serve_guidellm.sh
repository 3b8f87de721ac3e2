#!/usr/bin/env bash
# GuideLLM (concurrent profile, shared-prefix synthetic data) against yoco-serve on the bundled model:
# TTFT and inter-token latency at concurrency 1, 4, 16 with fast prefill and prefix caching on/off.
# Extra arguments go to benches/serve_guidellm.py (e.g. --levels 1,4 --requests 16 --configs fp+pc).
# Needs: make setup (guidellm is in the locked dev dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python benches/serve_guidellm.py "$@"
