"""lm-evaluation-harness against ``yoco-serve``, with fast prefill on and off.

    .venv/bin/python evals/lm_eval_serve.py [--limit N] [--model DIR]

Starts ``yoco-serve`` (the bundled model unless ``--model``) once with ``--kv-sharing-fast-prefill``
and once with ``--no-kv-sharing-fast-prefill``, and runs lm-eval's own API clients against it:

* ``local-completions`` (loglikelihood requests: ``echo`` + ``logprobs``, i.e. prompt logprobs, which
  vLLM refuses with fast prefill on): ``yoco_heldout_ppl`` (rolling loglikelihood of held-out text)
  and ``yoco_recall_mc`` (long-context retrieval as 4-way multiple choice);
* ``local-chat-completions`` (generate-until through the chat template): ``yoco_recall_chat``.

The tasks are the YAML files in ``evals/lm_eval_tasks/`` over ``evals/data/`` (no downloads). Prints
each score for both settings (Markdown, for benches/RESULTS.md) and exits non-zero when they differ.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TASKS = os.path.join(HERE, "lm_eval_tasks")
COMPLETION_TASKS = ["yoco_heldout_ppl", "yoco_recall_mc"]
CHAT_TASKS = ["yoco_recall_chat"]


def _scores(results: dict) -> dict:
    out = {}
    for task, metrics in results["results"].items():
        for k, v in metrics.items():
            metric, _, filt = k.partition(",")
            if filt and "_stderr" not in metric and isinstance(v, (int, float)):
                out[f"{task} {metric}" + ("" if filt == "none" else f" ({filt})")] = float(v)
    return out


def run_once(base: str, model_dir: str, limit: int | None) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=TASKS)
    common = dict(task_manager=tm, limit=limit, log_samples=False, bootstrap_iters=0, random_seed=0,
                  numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    tok_args = f"tokenizer_backend=huggingface,tokenizer={model_dir}"
    scores = _scores(lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"model=yoco-tiny,base_url={base}/v1/completions,{tok_args},num_concurrent=1,max_retries=1,"
                   "tokenized_requests=True,max_length=2048",
        tasks=COMPLETION_TASKS, batch_size=1, **common))
    scores.update(_scores(lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args=f"model=yoco-tiny,base_url={base}/v1/chat/completions,num_concurrent=1,max_retries=1",
        tasks=CHAT_TASKS, apply_chat_template=True, batch_size=1, **common)))
    return scores


def evaluate(limit: int | None = None, model: str | None = None) -> dict:
    """``{"fast prefill on": scores, "fast prefill off": scores}``."""
    sys.path.insert(0, HERE)
    from serve_process import yoco_serve

    from yoco_rs import bundled

    model_dir = model or bundled.default_model_dir()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cwd = os.getcwd()
    os.chdir(ROOT)  # the task YAMLs name their data files relative to the repository root
    try:
        out = {}
        for name, flag in (("fast prefill on", "--kv-sharing-fast-prefill"),
                           ("fast prefill off", "--no-kv-sharing-fast-prefill")):
            flags = ([model] if model else []) + [flag, "--served-model-name", "yoco-tiny", "--seed", "0"]
            with yoco_serve(*flags) as base:
                out[name] = run_once(base, model_dir, limit)
        return out
    finally:
        os.chdir(cwd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, help="first N documents of each task (default: all)")
    ap.add_argument("--model", help="checkpoint directory (default: the bundled model)")
    args = ap.parse_args()
    res = evaluate(args.limit, args.model)
    on, off = res["fast prefill on"], res["fast prefill off"]
    print("| task metric | fast prefill on | fast prefill off |\n|---|---|---|")
    for k in sorted(on):
        print(f"| {k} | {on[k]:.6g} | {off.get(k, float('nan')):.6g} |")
    if on != off:
        print("\nscores DIFFER between fast prefill on and off")
        sys.exit(1)


if __name__ == "__main__":
    main()
