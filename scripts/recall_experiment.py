"""Prototype runs for the bundled model's long-context retrieval (issue 18): MQAR-style training.

    nice -n 10 .venv/bin/python scripts/recall_experiment.py --name r1 --steps 300 > r1.log 2>&1

Same architecture as ``train_default_model.py`` (every Gemma 3n feature on, window 64), the bundled
tokenizer (no tokenizer training, to save time), and a mix of:

* MQAR-style recall rows ("multi-query associative recall", Arora et al. 2023): a dense context of
  ``- key = value`` facts between short English filler lines, then ``Recall:`` and a query line for
  *every* fact in shuffled order, the loss on the answers only (many supervised targets per row,
  instead of one or a few);
* English rows (the docstrings, loss on every token), so the model keeps writing text.

``--narrow-window W --narrow-steps N``: for the first N steps the sliding layers see only W tokens
(the model's ``config.sliding_window``, read by the mask at every forward), so even short contexts can
be answered only through the full-attention layers (and layer 5 through layer 2's shared KV); the
induction circuit then forms on short, cheap rows with a strong gradient, and the later steps at the
real window 64 stretch it to long contexts.

Every ``--probe-every`` steps: teacher-forced exact-match accuracy (every answer token the argmax) on
the held-out questions of ``evals/data/recall.jsonl`` at 2x/4x/8x the window.

Runs of 2026-12-01 (shared 2-core box, load 4-6, nice 10; ``recall`` = loss on the answer tokens,
``acc`` = argmax accuracy on the batch's answer tokens; lr 3e-3, AdamW, warmup 20, cosine):

* A/B (400 keys/values, window-8 phase vs real window, 160-288 tokens): stopped at ~90/50 steps (too
  slow under load), recall 6.4-6.7, probe 0/0/0.
* C, D (400 words, narrow window 8 / 4, 96-token dense rows, batch 16, HF init): 90 steps, recall
  plateau 5.5-5.9, acc 0.05-0.10 (multi-piece values' later pieces only).
* E (= C with ``--qnorm-init 0.177``): 1188 steps (1490 CPU-s): recall 5.6 -> 4.7-5.2, acc 0.04-0.16;
  probe 0.00 at 2x/4x/8x (window 64 and 8) at every 100 steps. No circuit with 400 keys.
* F (400 words, real window 64, 224 tokens, 25% English, qnorm 0.177): 450 steps, recall 5.4-6.0,
  probe 0/0/0.
* G (``--n-words 32``, window 4, 48-token pure-fact rows, batch 32, qnorm 0.177): chance ln 32 =
  3.47; recall 3.4 at step 50, 2.5 at 90, 1.7 at 200, 1.6-1.7 at 490 (acc 0.34-0.38; 540 CPU-s): retrieval
  through the full layers does form with a small key/value vocabulary, in ~100 steps.

Runs of 2026-12-03 (vocabulary schedules, pure MQAR rows at window 4, 1-hop ``- key value`` facts):
400 words never left the plateau; 64 words crawled from loss 3.7 to 2.1 in 600 steps (acc ~0.3, i.e.
"one of the values in context", not "the value of this key"); the 1-hop format was slower still.

Runs of 2026-12-04 (idle 2-core box, 1 thread each): **the fix is an induction warm-up.**

* I1 (``--induction-frac 1 --induction-steps 400``, 32 x 64-token rows of a random token sequence
  repeated, window 4): the repeat loss sits at chance (ln 3900 = 8.3) for ~80 steps, then drops to
  0.7 by step 220 (acc 0.97): the induction heads form in the full layers, in ~2 CPU-minutes. Switched
  to the 64-word MQAR rows at step 400, the recall loss is 0.04-0.1 (acc 0.98) at once, where the same
  rows from scratch (run D above) plateaued at 2.1 after 600 steps.
* ``train_default_model.py`` with the warm-up but the old mix (m1): the circuit does not survive the
  English rows: the recall answers are one target in a few hundred tokens; rank of the right value
  in the hundreds at step 200.
* With the warm-up plus an auxiliary dense-recall batch each step (8 x 320 tokens, every fact asked,
  loss on the answers only; m3, 400 steps, 15 min): ``evals/retrieval.py`` scores 97.5% / 97.5% /
  95% at 2x / 4x / 8x (40 questions each); weighting that batch 3x (m4) was no better.

The probe's first form (prompt and answer encoded together, newline included) under-counted m3 at
0.38 / 0.25 / 0.20; it now tokenizes as the engine does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import default_model_data as data  # noqa: E402
import train_default_model as tdm  # noqa: E402


def short_filler(rng, docs, max_chars):
    _, text = docs[rng.randrange(len(docs))]
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    return lines[rng.randrange(len(lines))][:max_chars]


class Rows:
    def __init__(self, tok, docs, keys, values, seed, args):
        self.tok, self.docs, self.keys, self.values, self.seed, self.a = tok, docs, keys, values, seed, args

    def enc(self, s):
        e = self.tok.encode(s, add_special_tokens=False)
        return e.ids, e.offsets

    def recall_row(self, rng, length):
        """(ids, labels) of exactly ``length`` tokens (+1 for the shifted target)."""
        a = self.a
        s, spans, used = "", [], set()
        ids = []
        while True:
            ctx_target = rng.randint(a.ctx_min, max(a.ctx_min, min(a.ctx_max, int(length * 0.7))))
            keys = [k for k in self.keys if k not in used]
            rng.shuffle(keys)
            facts, ctx, n = [], "", 0
            while n < ctx_target and keys:
                if rng.random() < a.fact_p:
                    k, v = keys.pop(), rng.choice(self.values)
                    used.add(k)
                    facts.append((k, v))
                    piece = data.fact(k, v) if a.sep == "=" else f"- {k}{a.sep} {v}\n".replace("  ", " ")
                else:
                    piece = short_filler(rng, self.docs, a.filler_chars) + "\n"
                ctx += piece
                n += len(piece) / 3.2  # ~chars per token; exact counts are not needed here
            if not facts:
                continue
            rng.shuffle(facts)
            s += ctx + "Recall:\n"
            for k, v in facts[: a.max_queries]:
                line = f"- {k} =" if a.sep == "=" else f"- {k}{a.sep}".rstrip()
                s += line
                spans.append((len(s), len(s) + len(v) + 1))  # " value" (its tokens are the targets)
                s += f" {v}\n"
            s += "\n"
            ids, offs = self.enc(s)
            if len(ids) >= length:
                break
        ids, offs = [2] + ids[:length], [(0, 0)] + offs[:length]
        labels = [-100] * len(ids)
        j = 0
        for i, (st, en) in enumerate(offs):
            while j < len(spans) and spans[j][1] <= st:
                j += 1
            if j < len(spans) and st < spans[j][1] and en > spans[j][0] and i > 0:
                labels[i] = ids[i]
        return ids, labels

    def text_row(self, rng, length):
        ids = [2]
        i = rng.randrange(len(self.docs))
        while len(ids) <= length:
            ids += self.enc(self.docs[i % len(self.docs)][1] + "\n\n")[0]
            i += 1
        ids = ids[: length + 1]
        return ids, list(ids)

    def induction_row(self, rng, length):
        return tdm.induction_row(rng, length, *self.a.induction_ids)

    def batch(self, step, bs, length):
        import torch

        xs, ys = [], []
        ind = self.a.induction_frac if step < self.a.induction_steps else 0.0
        for b in range(bs):
            rng = random.Random(self.seed * 1_000_003 + step * 997 + b)
            r = rng.random()
            if r < ind:
                ids, lab = self.induction_row(rng, length)
            elif rng.random() < self.a.text_frac:
                ids, lab = self.text_row(rng, length)
            else:
                ids, lab = self.recall_row(rng, length)
            xs.append(ids)
            ys.append(lab)
        return torch.tensor(xs), torch.tensor(ys)


def loss_of(model, x, y):
    """Per-target loss on the labelled positions, and whether each target is the argmax."""
    import torch.nn.functional as F

    logits, tgt = tdm.labelled_logits(model, x, y)
    return F.cross_entropy(logits, tgt, reduction="none"), y[:, 1:] != -100, logits.argmax(-1) == tgt


def probe(model, tok, rows_by_mult, window):
    """Teacher-forced exact match on the answer's pieces, tokenized as the engine sees them: the prompt
    encoded alone (it ends with ``=``), then `` value`` (encoding prompt and answer together merges
    pieces across the boundary and asks for the newline too, which under-counted: 0.25 here where
    ``evals/retrieval.py``'s greedy answers scored 0.975)."""
    import torch

    out = {}
    model.eval()
    with torch.no_grad():
        for mult, rows in rows_by_mult.items():
            ok = 0
            for r in rows:
                ctx = [2] + tok.encode(r["prompt"], add_special_tokens=False).ids
                ans = tok.encode(" " + r["answer"], add_special_tokens=False).ids
                x = torch.tensor([ctx + ans[:-1]])
                h = model.model(input_ids=x, use_cache=False).last_hidden_state[0, len(ctx) - 1:]
                ok += model.lm_head(h).argmax(-1).tolist() == ans
            out[mult] = ok / len(rows)
    model.train()
    return out


def generated_probe(tok, keys, values, n):
    """{multiple: [{"prompt", "answer"}]}: held-out filler with facts over the given vocabulary, one
    question per context about a fact more than a window back (as ``evals/make_eval_data.py``)."""
    rng = random.Random(4242)
    docs = data.documents("heldout")
    count = lambda s: len(tok.encode(s, add_special_tokens=False).ids)  # noqa: E731
    out = {}
    for m in (2, 4, 8):
        rows = []
        while len(rows) < n:
            ep = data.recall_episode(rng, docs, m * tdm.WINDOW - 8, count, keys, values, 1, far_from=tdm.WINDOW)
            if ep:
                ctx, [(k, v)] = ep
                rows.append({"prompt": ctx + data.recall_query(k), "answer": v})
        out[m] = rows
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="r")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--seq-late", type=int, default=320, help="row length after the narrow phase")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--text-frac", type=float, default=0.25)
    ap.add_argument("--ctx-min", type=int, default=24)
    ap.add_argument("--ctx-max", type=int, default=260)
    ap.add_argument("--fact-p", type=float, default=0.5)
    ap.add_argument("--filler-chars", type=int, default=120)
    ap.add_argument("--max-queries", type=int, default=24)
    ap.add_argument("--narrow-window", type=int, default=0)
    ap.add_argument("--narrow-steps", type=int, default=0)
    ap.add_argument("--probe-every", type=int, default=100)
    ap.add_argument("--probe-n", type=int, default=30)
    ap.add_argument("--qnorm-init", type=float, default=0.0, help="q_norm weight at init (0: HF's 1.0)")
    ap.add_argument("--n-words", type=int, default=0, help="first N keys and values only (0: all 400)")
    ap.add_argument("--words-schedule", default="",
                    help="curriculum over the key/value vocabulary, 'N@STEP,...' (e.g. '32@0,128@150,400@300'): "
                         "from STEP on, the first N keys and values")
    ap.add_argument("--gen-probe", type=int, default=0,
                    help="probe on N generated held-out questions per length over the run's final vocabulary "
                         "(instead of evals/data/recall.jsonl)")
    ap.add_argument("--sep", default="=", help="fact separator: '=' (the eval's '- key = value'), ' ' (none: '- key value')")
    ap.add_argument("--induction-frac", type=float, default=0.0,
                    help="share of rows that are a repeated random token sequence (induction warm-up)")
    ap.add_argument("--induction-steps", type=int, default=0, help="induction rows only before this step")
    ap.add_argument("--induction-ids", default="100,4000", help="lo,hi token id range of the random sequences")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--time-budget-s", type=float, default=0)
    ap.add_argument("--save", default="")
    args = ap.parse_args()
    args.induction_ids = tuple(int(x) for x in args.induction_ids.split(","))

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from tokenizers import Tokenizer
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = Tokenizer.from_file(os.path.join(ROOT, "python", "yoco_rs", "default_model", "tokenizer.json"))
    docs = data.documents("train")
    keys, values = data.task_words(tok)
    if args.n_words:  # a smaller key/value vocabulary (the probe's questions then mostly miss it)
        keys, values = keys[: args.n_words], values[: args.n_words]
    cfg = Gemma3nTextConfig(**tdm.MODEL)
    cfg._attn_implementation = "sdpa"
    model = Gemma3nForCausalLM(cfg)
    opt = tdm.init_and_optimizer(model, args.lr, args.qnorm_init)
    rows = Rows(tok, docs, keys, values, args.seed, args)
    schedule = sorted((int(st), int(n)) for n, st in (x.split("@") for x in args.words_schedule.split(",") if x))
    all_keys, all_values = keys, values
    if schedule:
        keys, values = all_keys[: schedule[-1][1]], all_values[: schedule[-1][1]]
    if args.gen_probe:
        by_mult = generated_probe(tok, keys, values, args.gen_probe)
    else:
        pr = [json.loads(line) for line in open(os.path.join(ROOT, "evals", "data", "recall.jsonl"))]
        by_mult = {m: [r for r in pr if r["multiple"] == m][: args.probe_n] for m in (2, 4, 8)}
    print(f"{args.name}: {vars(args)}", flush=True)
    t0, c0 = time.time(), time.process_time()
    model.train()
    for step in range(args.steps):
        narrow = step < args.narrow_steps and args.narrow_window
        w = args.narrow_window if narrow else tdm.WINDOW
        model.config.sliding_window = w
        length = args.seq if (narrow or not args.narrow_steps) else args.seq_late
        if schedule:
            n_now = max(n for st, n in schedule if st <= step)
            rows.keys, rows.values = all_keys[:n_now], all_values[:n_now]
        x, y = rows.batch(step, args.batch, length)
        lr = tdm.lr_at(step, args.steps, args.lr, args.warmup)
        per_tok, m, train_acc = loss_of(model, x, y)
        tdm.optimizer_step(model, opt, per_tok.mean(), lr)
        if step % 10 == 0 or step == args.steps - 1:
            # recall vs text loss: recall rows are those with some -100 labels
            is_rec = (y[:, 1:] == -100).any(1)
            rec_mask = m & is_rec[:, None]
            txt_mask = m & ~is_rec[:, None]
            flat_rec = rec_mask[m]
            rl = per_tok[flat_rec].mean().item() if flat_rec.any() else float("nan")
            racc = train_acc[flat_rec].float().mean().item() if flat_rec.any() else float("nan")
            tl = per_tok[~flat_rec].mean().item() if (~flat_rec).any() else float("nan")
            print(f"step {step} w {w} len {length} recall {rl:.3f} acc {racc:.2f} text {tl:.3f} targets {int(flat_rec.sum())} "
                  f"lr {lr:.1e} wall {time.time() - t0:.0f}s cpu {time.process_time() - c0:.0f}s", flush=True)
        if args.probe_every and (step + 1) % args.probe_every == 0 or step == args.steps - 1:
            model.config.sliding_window = tdm.WINDOW
            acc = probe(model, tok, by_mult, tdm.WINDOW)
            print(f"probe step {step + 1}: " + " ".join(f"{m}x {a:.2f}" for m, a in acc.items()), flush=True)
            if narrow:
                model.config.sliding_window = args.narrow_window
                acc = probe(model, tok, by_mult, args.narrow_window)
                print(f"probe step {step + 1} (window {args.narrow_window}): "
                      + " ".join(f"{m}x {a:.2f}" for m, a in acc.items()), flush=True)
        if args.time_budget_s and time.time() - t0 > args.time_budget_s:
            print(f"time budget reached at step {step}", flush=True)
            model.config.sliding_window = tdm.WINDOW
            acc = probe(model, tok, by_mult, tdm.WINDOW)
            print(f"probe step {step + 1}: " + " ".join(f"{m}x {a:.2f}" for m, a in acc.items()), flush=True)
            break
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
