"""One real-size run per process, yoco-rs or transformers, on a checkpoint from ``e2b_checkpoint.build``:
greedy tokens, load time, peak RSS and step times, printed as one JSON line. The real-size test and
``benches/e2b_cpu.py`` run these one after the other in fresh processes, so the two models (17.6 GB
together in float32) never share memory.

    python tests/e2b_runs.py {yoco,hf} MODEL_DIR --dtype float32 --tokens PROMPTS_JSON --max-tokens 8
    python tests/e2b_runs.py {yoco,hf} MODEL_DIR --dtype bfloat16 --speed [--fast off]

transformers runs ``Gemma3nForCausalLM`` (eager attention) built without initialization, its text weights
loaded from the files by name (the released layout's ``model.language_model.*``); its per-layer
embedding table is the file's bf16 table memory-mapped, rows cast to the model dtype before the scale:
the same values as a table converted on load (the math is transformers'; only where the table lives
differs), so a float32 reference needs ~10 GB instead of 17.6 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# ---- transformers ---------------------------------------------------------------------------------------------


def load_hf(model_dir: str, dtype: torch.dtype):
    import torch.nn.functional as F
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig
    from transformers.initialization import no_init_weights

    from e2b_checkpoint import hf_text_state_dict
    from yoco_rs.models.gemma3n.ple_host import mmap_safetensors

    text = json.load(open(os.path.join(model_dir, "config.json")))["text_config"]
    cfg = Gemma3nTextConfig(**{k: v for k, v in text.items() if k not in ("torch_dtype", "model_type")})
    cfg._attn_implementation = "eager"
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights():
            model = Gemma3nForCausalLM(cfg)  # uninitialized: pages untouched until loaded
    finally:
        torch.set_default_dtype(default)
    ple = model.model.embed_tokens_per_layer
    params = dict(model.named_parameters())
    loaded = set()
    with torch.no_grad():
        for name, (path, key) in hf_text_state_dict(model_dir).items():
            t = mmap_safetensors(path, key)  # one tensor mapped at a time: its pages leave RSS with it
            if name == "model.embed_tokens_per_layer.weight":
                table = t
                ple.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)  # frees its own
            else:
                params[name].copy_(t)
            loaded.add(name)
            del t
    missing = set(params) - loaded
    assert missing <= {"model.embed_tokens_per_layer.weight", "lm_head.weight"}, missing
    scale = ple.embed_scale

    def forward(ids, _t=table, _s=scale, _d=dtype):  # nn.Embedding's lookup, then transformers' scale
        return F.embedding(ids, _t).to(_d) * _s.to(_d)

    ple.forward = forward
    model.tie_weights()
    return model.eval()


def hf_tokens(model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    out = []
    for p in prompts:
        with torch.no_grad():
            g = model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens)
        out.append(g[0, len(p):].tolist())
    return out


def stamp() -> tuple[float, float]:
    """(wall s, process CPU s) now."""
    return time.perf_counter(), time.process_time()


def hf_time(model, prompts: list[list[int]], new: int) -> list[tuple[float, float]]:
    """Stamps of a batched ``generate``: before it, then after each forward (a logits processor runs once
    per generated token: after the prefill, then after each decode step)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps = [stamp()]

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(stamp())
            return scores

    ids = torch.tensor(prompts)  # equal lengths: no padding
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, logits_processor=LogitsProcessorList([Stamp()]))
    return stamps


# ---- yoco-rs --------------------------------------------------------------------------------------------------


def load_yoco(model_dir: str, dtype: str, fast: bool, on_device: bool = False, max_model_len: int = 1024,
              batch_invariant: bool = True):
    from yoco_rs import Engine

    return Engine(model_dir, dtype=dtype, kv_sharing_fast_prefill=fast, enable_prefix_caching=False,
                  max_model_len=max_model_len, kv_cache_memory=512 << 20,
                  per_layer_embeddings_on_device=on_device, batch_invariant=batch_invariant)


def yoco_tokens(eng, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from yoco_rs import SamplingParams

    p = SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in eng.generate(prompts, p, use_tqdm=False)]


def yoco_time(eng, prompts: list[list[int]], new: int) -> list[tuple[float, float]]:
    """Stamps of serving ``prompts`` together: before, then after each engine step (the first step
    prefills every prompt of 32 tokens, each later one decodes every stream)."""
    from yoco_rs import SamplingParams

    p = SamplingParams(temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        eng.add_request(f"t{time.monotonic_ns()}-{i}", prompt, p)
    stamps = [stamp()]
    while eng.has_unfinished_requests():
        eng.step()
        stamps.append(stamp())
    return stamps


def step_times(stamps: list[tuple[float, float]]) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """(prefill (wall, CPU), decode steps' (wall, CPU)) from ``*_time`` stamps: the first interval is the
    prefill, every later one a decode step."""
    d = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(stamps, stamps[1:])]
    return d[0], d[1:]


def median(v: list[float]) -> float:
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


# ---- the two kinds of run ---------------------------------------------------------------------------------------


def speed_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [[2] + torch.randint(10, 200_000, (length - 1,), generator=g).tolist() for _ in range(n)]


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if args.impl == "hf":
        model = load_hf(args.model, dtype)
        gen_tokens, gen_time = (lambda p, n: hf_tokens(model, p, n)), (lambda p, n: hf_time(model, p, n))
    else:
        model = load_yoco(args.model, args.dtype, args.fast == "on", args.ple_on_device,
                          batch_invariant=not args.no_batch_invariant)
        gen_tokens, gen_time = (lambda p, n: yoco_tokens(model, p, n)), (lambda p, n: yoco_time(model, p, n))
    out = {"impl": args.impl, "dtype": args.dtype, "fast_prefill": args.fast,
           "batch_invariant": not args.no_batch_invariant, "load_s": time.perf_counter() - t0,
           "rss_after_load_gib": peak_rss_gib()}
    if args.tokens:
        prompts = json.load(open(args.tokens))
        out["tokens"] = gen_tokens(prompts, args.max_tokens)
        if args.impl == "yoco" and args.also_fast_off:  # a second engine, the first one freed
            import gc

            del model, gen_tokens, gen_time
            gc.collect()
            model = load_yoco(args.model, args.dtype, False, args.ple_on_device)
            out["tokens_fast_off"] = yoco_tokens(model, prompts, args.max_tokens)
    if args.speed:
        steps = args.decode_steps
        gen_time(speed_prompts(1, 16, seed=0), 2)  # warm-up
        for streams in (() if args.no_decode else (1, 8)):
            _, decode = step_times(gen_time(speed_prompts(streams, 32, seed=streams), 1 + steps))
            # medians: a step that lost its core to another process for a while does not count
            out[f"decode_ms_per_step_{streams}"] = 1e3 * median([w for w, _ in decode])
            out[f"decode_cpu_ms_per_step_{streams}"] = 1e3 * median([c for _, c in decode])
        if args.prefill:
            prompts = speed_prompts(1, args.prefill, seed=99)
            if args.save_logits and args.impl == "yoco":  # the prefill step's last-token logits
                runner, seen = model._runner, []
                real = runner.execute
                runner.execute = lambda b, **kw: seen.append(real(b, **kw)) or seen[-1]
            (wall, cpu), _ = step_times(gen_time(prompts, 1))
            out[f"prefill_{args.prefill}_s"], out[f"prefill_{args.prefill}_cpu_s"] = wall, cpu
            if args.save_logits and args.impl == "yoco":
                runner.execute = real
                torch.save(seen[-1][-1].clone(), args.save_logits)
    out["peak_rss_gib"] = peak_rss_gib()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("impl", choices=("yoco", "hf"))
    ap.add_argument("model")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--fast", default="on", choices=("on", "off"), help="yoco-rs fast prefill")
    ap.add_argument("--ple-on-device", action="store_true")
    ap.add_argument("--no-batch-invariant", action="store_true", help="yoco-rs: EngineConfig.batch_invariant=False")
    ap.add_argument("--also-fast-off", action="store_true", help="yoco-rs: the tokens again with fast prefill off")
    ap.add_argument("--tokens", help="JSON file with a list of prompts (token ids): greedy tokens")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--speed", action="store_true", help="decode ms/step at 1 and 8 streams")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=0, help="also time one prefill of this many tokens")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the shared box is oversubscribed; 2 threads then spin)")
    ap.add_argument("--no-decode", action="store_true", help="with --speed: only the prefill")
    ap.add_argument("--save-logits", help="yoco-rs: save the prefill's last-token logits here (torch.save)")
    print(json.dumps(run(ap.parse_args())), flush=True)


if __name__ == "__main__":
    main()
