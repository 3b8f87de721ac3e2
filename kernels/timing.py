"""Triton kernel speed against the hardware limit (GPU only).

    PYTHONPATH=python python kernels/timing.py [--quick]

* decode attention: bytes it must move (each visible K/V once) / time, as a fraction of the GPU's
  HBM bandwidth (datasheet, and a measured device-to-device copy);
* prefill attention: causal FLOPs / time, as a fraction of the dense bf16 tensor-core peak;
* KV write: bytes / time.
Times are CUDA-event medians from ``triton.testing.do_bench``."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

# (bytes/s HBM, dense bf16 FLOP/s) from vendor datasheets, matched on torch.cuda.get_device_name()
SPECS = [
    ("H200", 4.8e12, 989e12), ("H100 NVL", 3.9e12, 835e12), ("H100 PCIe", 2.0e12, 756e12), ("H100", 3.35e12, 989e12),
    ("GH200", 4.0e12, 989e12), ("A100-SXM4-80GB", 2.039e12, 312e12), ("A100 80GB PCIe", 1.935e12, 312e12),
    ("A100", 1.555e12, 312e12), ("L40S", 0.864e12, 362e12), ("L4", 0.3e12, 121e12), ("A10", 0.6e12, 125e12),
]


def device_specs() -> tuple[str, float | None, float | None]:
    if not torch.cuda.is_available():
        return "cpu (dry run)", None, None
    name = torch.cuda.get_device_name()
    for key, bw, fl in SPECS:
        if key in name:
            return name, bw, fl
    return name, None, None


def measured_copy_bandwidth(bench, device) -> float:
    x = torch.empty(1 << (30 if device == "cuda" else 20), dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), warmup=10, rep=100)
    return 2 * x.numel() / (ms * 1e-3)


def _wall_clock_ms(fn, warmup=1, rep=1) -> float:
    """The dry run's stand-in for ``do_bench``: one timed call (the figures mean nothing on a CPU)."""
    import time

    fn()
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny shapes, Triton interpreter: exercises the code, the numbers mean nothing")
    a = ap.parse_args(argv)
    dev = "cuda"
    if a.dry_run or not torch.cuda.is_available():
        if not a.dry_run:
            print("kernel timing needs a GPU; skipped (--dry-run exercises the code on the CPU)")
            return 0
        os.environ.setdefault("TRITON_INTERPRET", "1")
        dev = "cpu"
    sys.path.insert(0, os.path.dirname(__file__))
    from cases import make

    if dev == "cuda":
        from triton.testing import do_bench
    else:
        do_bench = _wall_clock_ms

    from yoco_rs.kernels.backend import TritonAttentionBackend
    from yoco_rs.kernels.decode_attention import decode_attention
    from yoco_rs.kernels.kv_write import write_kv
    from yoco_rs.kernels.paged_attention import paged_attention

    name, spec_bw, spec_fl = device_specs()
    copy_bw = measured_copy_bandwidth(do_bench, dev)
    print(f"device {name}: datasheet HBM {spec_bw / 1e12 if spec_bw else float('nan'):.2f} TB/s, "
          f"measured copy {copy_bw / 1e12:.2f} TB/s, dense bf16 peak {spec_fl / 1e12 if spec_fl else float('nan'):.0f} TFLOP/s")
    results = []
    shape = dict(num_q_heads=8, num_kv_heads=2, head_dim=256, dtype=torch.bfloat16, device=dev)
    if dev == "cpu":
        shape.update(head_dim=32, dtype=torch.float32)
    backend = TritonAttentionBackend()

    def meta(c):
        return backend.build_metadata(
            query_start_loc_cpu=c.qsl.cpu(), seq_lens_cpu=c.seq_lens.cpu(), query_start_loc=c.qsl,
            seq_lens=c.seq_lens, positions=c.positions, block_tables=[c.block_table], slot_mapping=None,
            windows=[c.window or None], block_size=c.kv.shape[2], dtype=c.q.dtype)

    print(f"decode attention ({str(shape['dtype'])[6:]}, 8 q / 2 kv heads, head_dim {shape['head_dim']}): "
          "bytes moved / time")
    batches = (1, 8, 64) if dev == "cuda" else (1, 2)
    ctxs = (4096,) if a.quick else (1024, 4096, 16384)
    ctxs = ctxs if dev == "cuda" else (40,)
    prefill = ((2048,) if a.quick else (512, 2048, 8192)) if dev == "cuda" else (24,)
    window = 512 if dev == "cuda" else 16
    for bs in (16, 64):
        for w in (0, window):
            for b in batches:
                for ctx in ctxs:
                    if w and ctx != ctxs[-1]:
                        continue
                    c = make("decode", [(ctx - 1, 1)] * b, block_size=bs, window=w, **shape)
                    m = meta(c)
                    out = torch.empty_like(c.q)
                    ms = do_bench(lambda: decode_attention(c.q, c.kv, c.block_table, c.qsl, c.seq_lens, window=w,
                                                           out=out, max_seq_len=m.max_seq_len), warmup=10, rep=50)
                    bw = c.decode_bytes() / (ms * 1e-3)
                    r = dict(kernel="decode", block=bs, window=w, batch=b, ctx=ctx, us=ms * 1e3, bytes=c.decode_bytes(),
                             tbps=bw / 1e12, frac_datasheet=bw / spec_bw if spec_bw else None, frac_copy=bw / copy_bw)
                    results.append(r)
                    print(f"  block {bs:<3} window {w or 'full':<5} batch {b:<3} ctx {ctx:<6} {ms * 1e3:8.1f} us "
                          f"{bw / 1e12:6.2f} TB/s = {100 * bw / spec_bw if spec_bw else float('nan'):5.1f}% of datasheet, "
                          f"{100 * bw / copy_bw:5.1f}% of measured copy", flush=True)
                    del c, out
    print(f"prefill attention ({str(shape['dtype'])[6:]}, causal): FLOPs / time")
    for bs in (16, 64):
        for w in (0, window):
            for n in prefill:
                c = make("prefill", [(0, n)], block_size=bs, window=w, **shape)
                out = torch.empty_like(c.q)
                ms = do_bench(lambda: paged_attention(c.q, c.kv, c.block_table, c.qsl, c.seq_lens, window=w, out=out),
                              warmup=5, rep=30)
                fl = c.attention_flops() / (ms * 1e-3)
                r = dict(kernel="prefill", block=bs, window=w, tokens=n, us=ms * 1e3, tflops=fl / 1e12,
                         frac_peak=fl / spec_fl if spec_fl else None)
                results.append(r)
                print(f"  block {bs:<3} window {w or 'full':<5} tokens {n:<5} {ms * 1e3:9.1f} us {fl / 1e12:7.1f} TFLOP/s "
                      f"= {100 * fl / spec_fl if spec_fl else float('nan'):5.1f}% of dense peak", flush=True)
    print(f"KV write ({str(shape['dtype'])[6:]}): bytes / time")
    for t in ((64, 8192) if dev == "cuda" else (8,)):
        c = make("write", [(0, t)], block_size=16, **shape)
        k = torch.randn((t, 2, shape["head_dim"]), device=dev, dtype=shape["dtype"])
        slots = torch.randperm(c.kv.shape[1] * 16, device=dev)[:t]
        ms = do_bench(lambda: write_kv(c.kv, k, k, slots), warmup=10, rep=50)
        nbytes = 4 * k.numel() * k.element_size()
        results.append(dict(kernel="write_kv", tokens=t, us=ms * 1e3, tbps=nbytes / (ms * 1e-3) / 1e12))
        print(f"  tokens {t:<5} {ms * 1e3:8.1f} us {nbytes / (ms * 1e-3) / 1e12:6.2f} TB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=name, copy_tbps=copy_bw / 1e12, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
