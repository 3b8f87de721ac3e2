"""Compile every Triton kernel launch the GPU path makes, for real GPU targets, on any machine.

The CPU tests run the kernels under Triton's interpreter, which does not type-check like the compiler
does (loop-carried types, constexpr use, dot shapes); this compiles the exact launches instead. The
wrappers are called with CPU tensors while ``JITFunction.__getitem__`` is patched to record each
launch (arguments, constexprs, ``num_warps``) instead of running it; each recording is then compiled
with ``triton.compile`` for sm_90 (H100/H200) and sm_80 (A100), which needs no GPU.

    PYTHONPATH=python python kernels/compile_check.py [--arch 90,80]

Must run without ``TRITON_INTERPRET``. Prints shared memory per kernel; exits 1 on a compile error."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

_DT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
       torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8"}


def record_launches(fn_calls) -> list[tuple]:
    """Runs ``fn_calls()`` with kernel launches recorded instead of executed."""
    from triton.runtime.jit import JITFunction

    recorded = []
    orig = JITFunction.__getitem__

    def fake_getitem(self, grid):
        def launch(*args, **kwargs):
            recorded.append((self, args, kwargs))
        return launch

    JITFunction.__getitem__ = fake_getitem
    try:
        fn_calls()
    finally:
        JITFunction.__getitem__ = orig
    return recorded


def _signature(fn, args, kwargs):
    names = fn.arg_names
    vals = dict(zip(names, args))
    opts = {}
    for k, v in kwargs.items():
        if k in names:
            vals[k] = v
        else:
            opts[k] = v
    sig, constexprs = {}, {}
    for i, n in enumerate(names):
        v = vals[n]
        if i in fn.constexprs if hasattr(fn, "constexprs") else False:
            sig[n] = "constexpr"
            constexprs[n] = v
        elif isinstance(v, torch.Tensor):
            sig[n] = "*" + _DT[v.dtype]
        elif isinstance(v, bool):
            sig[n] = "i1"
        elif isinstance(v, int):
            sig[n] = "i32" if -2**31 <= v < 2**31 else "i64"
        elif isinstance(v, float):
            sig[n] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {n}={v!r}")
    return sig, constexprs, opts


def _resources(cubin: bytes) -> str:
    """Registers per thread and stack (spill) bytes, from Triton's bundled cuobjdump."""
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return ""
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "REG:" in line:
            parts = dict(p.split(":", 1) for p in line.split() if ":" in p)
            return f"regs {parts.get('REG', '?'):>3} spill {parts.get('STACK', '?'):>3} B"
    return ""


def compile_all(launches, arches) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    seen, failures = set(), 0
    for fn, args, kwargs in launches:
        sig, constexprs, opts = _signature(fn, args, kwargs)
        key = (fn.__name__, tuple(sorted(sig.items())), tuple(sorted(constexprs.items())), tuple(sorted(opts.items())))
        if key in seen:
            continue
        seen.add(key)
        cx = ", ".join(f"{k}={v}" for k, v in constexprs.items() if k != "NUM_STAGES")
        for arch in arches:
            t = time.perf_counter()
            cxa = dict(constexprs)
            if "NUM_STAGES" in cxa:  # recorded on the CPU; what paged_attention.num_stages picks on this arch
                cxa["NUM_STAGES"] = 3 if arch >= 90 and fn.__name__ == "_decode_attention_kernel" else 2
            try:
                k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cxa),
                                   target=GPUTarget("cuda", arch, 32), options=opts)
                assert "cubin" in k.asm and len(k.asm["cubin"]) > 0, "no cubin produced"
                print(f"  sm_{arch} {fn.__name__:<26} ok   shared {k.metadata.shared:>6} B  {_resources(k.asm['cubin'])}"
                      f"  ({time.perf_counter() - t:4.1f}s)  {cx}", flush=True)
            except Exception as e:  # noqa: BLE001 - report every failing launch
                failures += 1
                print(f"  sm_{arch} {fn.__name__:<26} FAIL {type(e).__name__}: {str(e)[:400]}  {cx}", flush=True)
    return failures


def gpu_launches():
    """The launches of the GPU path: E2B attention shapes in bf16 (prefill/mixed, decode split and not,
    windowed), the tiny models' fp32 shapes, KV write and copy."""
    from yoco_rs.kernels.decode_attention import decode_attention
    from yoco_rs.kernels.kv_copy import copy_kv
    from yoco_rs.kernels.kv_write import write_kv
    from yoco_rs.kernels.paged_attention import paged_attention

    def calls():
        for dtype, hq, hkv, d, bs in ((torch.bfloat16, 8, 2, 256, 16), (torch.bfloat16, 8, 2, 256, 64),
                                      (torch.float32, 4, 2, 32, 16)):
            q = torch.zeros((8, hq, d), dtype=dtype)
            kv = torch.zeros((2, 4, bs, hkv, d), dtype=dtype)
            bt = torch.zeros((2, 3), dtype=torch.int32)
            qsl = torch.tensor([0, 5, 8], dtype=torch.int32)
            sl = torch.tensor([5, 9], dtype=torch.int32)
            paged_attention(q, kv, bt, qsl, sl, window=512)
            for splits in (1, 7):
                decode_attention(q[:2], kv, bt, torch.tensor([0, 1, 2], dtype=torch.int32), sl, num_splits=splits)
            write_kv(kv, q[:, :hkv], q[:, :hkv], torch.zeros(8, dtype=torch.int64))
            copy_kv(kv[None], torch.zeros((1, 4), dtype=torch.int32), 0)

    return record_launches(calls)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="90,80", help="comma-separated compute capabilities")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        print("compile_check must run without TRITON_INTERPRET")
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    launches = gpu_launches()
    print(f"compiling {len(launches)} recorded launches for sm_{a.arch}")
    failures = compile_all(launches, [int(x) for x in a.arch.split(",")])
    print(f"compile check: {'all ok' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
