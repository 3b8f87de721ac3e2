"""Real-size Gemma 3n E2B on the CPU, yoco-rs and transformers side by side in one run.

Per dtype (bfloat16, float32), each in a fresh process, one after the other (never two models in memory):
transformers (``Gemma3nForCausalLM``, eager attention; its per-layer table memory-mapped, see
``tests/e2b_runs.py``), yoco-rs with fast prefill on, yoco-rs with fast prefill off (prefill only). Each
reports load time, peak RSS, decode ms per step at 1 and 8 streams (32-token prompts, equal lengths so
transformers batches 8 without padding; the median of S decode steps, each step timed on its own:
transformers' by a logits processor stamping every forward, yoco-rs' around ``Engine.step``) and one
600-token prefill (the first forward); yoco-rs also saves the prefill's last-token logits, so
the run prints how far fast prefill on and off differ at this size. Times are given as wall and as
process CPU time (1 torch thread per process: on the shared, oversubscribed box a process gets a varying
share of a core, which wall time counts and CPU time does not); the ratios use both.

    .venv/bin/python benches/e2b_cpu.py [--model DIR] [--decode-steps 8] [--dtypes bfloat16,float32] [--rounds 1]

``--rounds R`` runs transformers and yoco-rs (fast prefill on) R times alternately and keeps each figure's
best (the load of the shared box changes over the minutes a run takes).

Without ``--model`` it first writes the checkpoint (``tests/e2b_checkpoint.py``, 8.8 GB) to a temp dir.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
sys.path.insert(0, TESTS)


def run(*args: str) -> dict:
    cmd = [sys.executable, os.path.join(TESTS, "e2b_runs.py"), *args]
    print("+", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-3000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def best_of(runs: list[dict]) -> dict:
    """Each numeric figure's minimum over ``runs`` (times, RSS); the rest from the first run."""
    out = dict(runs[0])
    for key, v in runs[0].items():
        if isinstance(v, float):
            out[key] = min(r[key] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=600)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    model = a.model
    if model is None:
        from e2b_checkpoint import build

        model = build(tempfile.mkdtemp(prefix="e2b-"))
    rows, tmp = [], tempfile.mkdtemp(prefix="e2b-logits-")
    with open("/proc/loadavg") as f:
        load0 = f.read().split()[0]
    for dt in a.dtypes.split(","):
        speed = ["--dtype", dt, "--speed", "--decode-steps", str(a.decode_steps), "--prefill", str(a.prefill)]
        hfs, ons = [], []
        for _ in range(a.rounds):
            hfs.append(run("hf", model, *speed))
            ons.append(run("yoco", model, *speed, "--save-logits", os.path.join(tmp, f"on-{dt}.pt")))
        hf, on = best_of(hfs), best_of(ons)
        if a.prefill:
            off = run("yoco", model, *speed, "--no-decode", "--fast", "off", "--save-logits",
                      os.path.join(tmp, f"off-{dt}.pt"))
            diff = (torch.load(os.path.join(tmp, f"on-{dt}.pt")) - torch.load(os.path.join(tmp, f"off-{dt}.pt"))).abs().max()
        else:  # decode only
            off, diff = {"load_s": float("nan"), "peak_rss_gib": float("nan")}, float("nan")
        rows.append((dt, hf, on, off, float(diff)))
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[0]
    p = a.prefill
    print(f"\n{datetime.datetime.now():%Y-%m-%d %H:%M}, load average {load0} -> {load1}, torch threads 1 per process\n")
    print(f"| dtype | impl | load s | peak RSS GiB | decode ms/step, 1 stream (wall / CPU) | 8 streams (wall / CPU) | "
          f"{p}-token prefill s (wall / CPU) |")
    print("|---|---|---|---|---|---|---|")

    def pair(r, wall, cpu, fmt):
        return "" if r.get(wall) is None else f"{r[wall]:{fmt}} / {r[cpu]:{fmt}}"

    for dt, hf, on, off, diff in rows:
        for name, r in (("transformers", hf), ("yoco-rs, fast prefill on", on), ("yoco-rs, fast prefill off", off)):
            print(f"| {dt} | {name} | {r['load_s']:.1f} | {r['peak_rss_gib']:.2f} | "
                  f"{pair(r, 'decode_ms_per_step_1', 'decode_cpu_ms_per_step_1', '.0f')} | "
                  f"{pair(r, 'decode_ms_per_step_8', 'decode_cpu_ms_per_step_8', '.0f')} | "
                  f"{pair(r, f'prefill_{p}_s', f'prefill_{p}_cpu_s', '.1f')} |")
        for unit, d, pf in (("wall", "decode_ms_per_step_", f"prefill_{p}_s"),
                            ("CPU", "decode_cpu_ms_per_step_", f"prefill_{p}_cpu_s")):
            prefill = f"fast on/off {on[pf] / off[pf]:.2f}; vs transformers {hf[pf] / on[pf]:.2f}x" if p else ""
            print(f"| {dt} | ratios ({unit}) | load {hf['load_s'] / on['load_s']:.2f}x faster | "
                  f"RSS {on['peak_rss_gib'] / hf['peak_rss_gib']:.2f}x | "
                  f"1 stream {hf[d + '1'] / on[d + '1']:.2f}x | "
                  f"8 streams {hf[d + '8'] / on[d + '8']:.2f}x batched, {8 * hf[d + '1'] / on[d + '8']:.2f}x one at a "
                  f"time | {prefill} |")
        print(f"\n{dt}: last-token logits of the {p}-token prefill, fast prefill on vs off: max |diff| {diff:.2e}\n")


if __name__ == "__main__":
    main()
