"""Train the bundled default model ``yoco-tiny`` and write its package files.

    nice -n 5 .venv/bin/python scripts/train_default_model.py > train.log 2>&1

A small Gemma 3n-architecture text model with every feature on (sliding + full attention layers, KV
sharing in the last half, per-layer embeddings, AltUp, LAuReL, the sparse MLP of the first layers),
trained on CPU from scratch, and a byte-fallback BPE tokenizer (``tokenizers``), on text that ships
with Python (see ``scripts/default_model_data.py``: docstrings, ``pydoc_data.topics``, a synthetic
long-context key/value recall task, chat turns). Deterministic: a fixed seed, a fixed thread count
(``--threads``), ``torch.use_deterministic_algorithms``; the same Python/torch versions and arguments
give the same weights (``--out`` and ``--probe-every`` do not change them).

Two phases. First an **induction warm-up** (``--induction-steps``): rows of a random token sequence
repeated, the loss on the repeats, with the sliding window narrowed to 4 so that only the full-attention
layers can look a repeat back; the induction heads that long-context recall needs form there in ~200
steps. From scratch, on the mixed rows alone, they never formed at this budget (the recall answers are
one target in hundreds of English tokens; see ``scripts/recall_experiment.py`` for the runs). Then the
**main mix** at the real 64-token window, with an auxiliary **dense-recall batch** each step (every fact
of an episode asked, the loss on the answers only, added to the mix's loss) that keeps the lookup's
gradient from drowning in the English tokens.

Writes ``python/yoco_rs/default_model/`` (or ``--out``): config.json,
generation_config.json, tokenizer.json, tokenizer_config.json (with the chat template),
model.safetensors (float32), and ``train_log.json`` (the loss curve and timing for the model card).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import default_model_data as data  # noqa: E402

VOCAB_SIZE = 4096
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
WINDOW = 64

MODEL = dict(
    vocab_size=VOCAB_SIZE, vocab_size_per_layer_input=3840,  # < vocab_size, like the real model
    hidden_size=128, hidden_size_per_layer_input=32,
    intermediate_size=384, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    # 2 sliding + 1 full, twice; the last 3 layers reuse the KV of layers 1 (sliding) and 2 (full).
    layer_types=(["sliding_attention"] * 2 + ["full_attention"]) * 2,
    num_kv_shared_layers=3,
    sliding_window=WINDOW,
    activation_sparsity_pattern=[0.95] + [0.0] * 5,
    laurel_rank=16, altup_num_inputs=4, altup_active_idx=0,
    max_position_embeddings=32768, final_logit_softcapping=30.0,
    pad_token_id=0, eos_token_id=1, bos_token_id=2,
)

GENERATION_CONFIG = {"bos_token_id": 2, "eos_token_id": [1, 5], "pad_token_id": 0,
                     "do_sample": True, "temperature": 0.7, "top_k": 40, "top_p": 0.95}

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content | trim }}"
    "{%- else -%}{%- for part in content -%}{%- if part['type'] == 'text' -%}{{ part['text'] | trim }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = text(messages[0]['content']) + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + text(message['content'])"
    " + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def turn(role: str, text: str) -> str:
    return f"<start_of_turn>{role}\n{text.strip()}<end_of_turn>\n"


def tokenizer_corpus(docs):
    rng = random.Random(7)
    for _, t in docs:
        yield t
    for _ in range(200):
        yield "Recall:\n- name = value\n- key = word\n"
    for name, t in docs[:2000]:
        yield turn("user", f"What does {name} do?") + turn("model", data.first_paragraph(t))


def train_tokenizer(docs):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    # Words keep their leading "▁" (SentencePiece style); digits are split one by one like Gemma's.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("▁"), "merged_with_next"),
        pre_tokenizers.Digits(individual_digits=True),
    ])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIALS + byte_tokens,
                                  show_progress=False, initial_alphabet=[], limit_alphabet=200)
    tok.train_from_iterator(tokenizer_corpus(docs), trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    # The byte pieces were reserved as trainer special tokens only to pin their ids (6..261); like
    # Gemma's they must be ordinary vocabulary pieces (byte fallback, never skipped as special).
    d = json.loads(tok.to_str())
    d["added_tokens"] = [t for t in d["added_tokens"] if t["content"] in SPECIALS]
    for t in d["added_tokens"]:
        t["special"] = True
    return Tokenizer.from_str(json.dumps(d))


def induction_row(rng: random.Random, length: int, lo: int = len(SPECIALS) + 256, hi: int = VOCAB_SIZE):
    """(ids, labels) of ``length + 1`` tokens: bos, then a random sequence of token ids in ``[lo, hi)``
    repeated; the labels are -100 on the first copy, the tokens on the repeats. The classic task on
    which induction heads form (Olsson et al. 2022): every repeated token is predictable only by
    finding its earlier occurrence and copying what followed it, the mechanism the recall task needs."""
    period = rng.randint(max(2, length // 4), max(2, length // 2))
    seq = [rng.randrange(lo, hi) for _ in range(period)]
    ids = [2] + (seq * (length // period + 2))[:length]
    return ids, [-100] * (period + 1) + ids[period + 1:]


def labelled_logits(model, x, y):
    """(soft-capped logits, targets) at the labelled positions of ``y`` (-100 elsewhere; ``y[:, i]`` is
    the target of ``x[:, i - 1]``), the lm_head run on those rows only."""
    import torch

    h = model.model(input_ids=x[:, :-1], use_cache=False).last_hidden_state
    tgt = y[:, 1:]
    m = tgt != -100
    logits = model.lm_head(h[m])
    cap = model.config.final_logit_softcapping
    return torch.tanh(logits / cap) * cap, tgt[m]


def labelled_loss(model, x, y):
    """Mean cross-entropy on the labelled positions of ``y``."""
    import torch.nn.functional as F

    return F.cross_entropy(*labelled_logits(model, x, y))


def optimizer_step(model, opt, loss, lr: float) -> None:
    """One AdamW update on ``loss`` at learning rate ``lr``, gradients clipped to norm 1."""
    import torch

    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def induction_batch(step: int, batch_size: int, length: int, seed: int):
    import torch

    rows = [induction_row(random.Random(seed * 7_000_003 + step * 991 + b), length) for b in range(batch_size)]
    return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


class Batches:
    """Deterministic training sequences of exactly ``seq + 1`` tokens (bos first): 40% English
    (documents from their start, concatenated), 50% recall episodes of 64..560 tokens, 10% chat."""

    def __init__(self, tok, docs, seq: int, seed: int, max_queries: int = 8, chat_p: float = 0.25):
        self.tok, self.docs, self.seq, self.seed = tok, docs, seq, seed
        self.max_queries, self.chat_p = max_queries, chat_p
        self.bos, self.eos = 2, 1
        self.keys, self.values = data.task_words(tok)

    def enc(self, s: str) -> list[int]:
        return self.tok.encode(s, add_special_tokens=False).ids

    def count(self, s: str) -> int:
        return len(self.enc(s))

    def text_seq(self, rng):
        ids = [self.bos]
        i = rng.randrange(len(self.docs))
        while len(ids) <= self.seq:
            ids += self.enc(self.docs[i % len(self.docs)][1] + "\n\n")
            i += 1
        return ids

    def recall_seq(self, rng):
        s, keys = "", list(self.keys)
        while self.count(s) <= self.seq:
            ep = data.recall_episode(rng, self.docs, rng.randint(48, 540), self.count, keys, self.values,
                                     n_queries=rng.randint(2, self.max_queries))
            if ep is None:
                continue
            ctx, asked = ep
            keys = [k for k in keys if f"- {k} =" not in ctx]  # unique keys within a sequence
            s += ctx + "Recall:\n" + "".join(data.fact(k, v) for k, v in asked) + "\n"
            if len(keys) < 20:
                keys = list(self.keys)
        return [self.bos] + self.enc(s)

    def dense_recall_row(self, rng, length: int):
        """(ids, labels) of ``length + 1`` tokens: recall episodes (filler with facts, 48 tokens to
        ``length``) each followed by a question about *every* fact, labels on the answers only; a
        ``chat_p`` share of the episodes is a chat exchange instead (the context and one question as
        the user's turn, the value and ``<end_of_turn>`` as the model's). The
        auxiliary batch that keeps the lookup's gradient from drowning in the English tokens (an
        answer is one token in a few hundred of a mixed row)."""
        s, spans, keys = "", [], list(self.keys)
        while True:
            ep = data.recall_episode(rng, self.docs, rng.randint(48, length), self.count, keys, self.values,
                                     n_queries=10_000)
            if ep is None:
                continue
            ctx, asked = ep
            keys = [k for k in keys if f"- {k} =" not in ctx]
            if len(keys) < 40:
                keys = list(self.keys)
            if rng.random() < self.chat_p:  # asked as a chat turn, as lm-eval's chat task and users do
                k, v = asked[0]
                s += turn("user", ctx + data.recall_query(k)) + "<start_of_turn>model\n"
                reply = f" {v}<end_of_turn>\n"  # " value": the very piece the context holds, copied
                spans.append((len(s), len(s) + len(reply) - 1))  # the value and <end_of_turn>
                s += reply
            else:
                s += ctx + "Recall:\n"
                for k, v in asked:
                    s += f"- {k} ="
                    spans.append((len(s), len(s) + len(v) + 1))
                    s += f" {v}\n"
                s += "\n"
            e = self.tok.encode(s, add_special_tokens=False)
            if len(e.ids) >= length:
                break
        ids = [self.bos] + e.ids[:length]
        labels = [-100] * len(ids)
        j = 0
        for i, (st, en) in enumerate(e.offsets[:length]):
            while j < len(spans) and spans[j][1] <= st:
                j += 1
            if j < len(spans) and st < spans[j][1] and en > spans[j][0]:
                labels[i + 1] = ids[i + 1]
        return ids, labels

    def recall_batch(self, step: int, batch_size: int, length: int):
        import torch

        rows = [self.dense_recall_row(random.Random(self.seed * 5_000_011 + step * 983 + b), length)
                for b in range(batch_size)]
        return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])

    def chat_seq(self, rng):
        s, keys = "", list(self.keys)
        while self.count(s) <= self.seq:
            if rng.random() < 0.5:
                name, text = self.docs[rng.randrange(len(self.docs))]
                q = rng.choice(["What does {} do?", "Explain {}.", "What is {}?", "Tell me about {}."])
                s += turn("user", q.format(name.removeprefix("topic:"))) + turn("model", data.first_paragraph(text))
            else:
                ep = data.recall_episode(rng, self.docs, rng.randint(48, 400), self.count, keys, self.values, 1)
                if ep is None:
                    continue
                ctx, [(k, v)] = ep
                s += turn("user", ctx + data.recall_query(k)) + f"<start_of_turn>model\n {v}<end_of_turn>\n"
        return [self.bos] + self.enc(s)

    def batch(self, step: int, batch_size: int):
        import torch

        rows = []
        for b in range(batch_size):
            rng = random.Random(self.seed * 1_000_003 + step * 997 + b)
            r = rng.random()
            ids = self.text_seq(rng) if r < 0.4 else self.recall_seq(rng) if r < 0.9 else self.chat_seq(rng)
            rows.append(ids[: self.seq + 1])
        return torch.tensor(rows, dtype=torch.long)


def write_configs(out, tok):
    from transformers import Gemma3nTextConfig

    cfg = Gemma3nTextConfig(**MODEL)
    cfg.architectures = ["Gemma3nForCausalLM"]
    cfg.dtype = "float32"
    d = cfg.to_dict()
    d.pop("transformers_version", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
    tok_cfg = {
        "tokenizer_class": "GemmaTokenizerFast",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False,
        "model_max_length": MODEL["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {"start_of_turn": "<start_of_turn>", "end_of_turn": "<end_of_turn>"},
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
        f.write("\n")
    return cfg


def save_weights(model, out):
    from safetensors.torch import save_file

    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    # Tied weights (lm_head = embed_tokens) are stored once, as transformers saves them.
    state.pop("lm_head.weight", None)
    tmp = os.path.join(out, ".model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(out, "model.safetensors"))


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def init_and_optimizer(model, lr: float, qnorm_init: float = 0.0):
    """Adjusts HF's initialization in place and returns the AdamW optimizer (weight decay on matrices
    only); shared with ``recall_experiment.py`` so its runs start exactly as this script's."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            # HF's init zeroes the per-layer-input branch's scale; start it small but non-zero so PLE learns.
            if "correct_output_scale" in name:
                p.fill_(0.1)
            # Opt-in (issue 18's retrieval work, see scripts/recall_experiment.py): Gemma 3n attends
            # with scaling 1.0 on RMS-normed q and k, so HF's init (q_norm weight 1) gives logits of
            # std sqrt(head_dim) ~ 5.7, a near-one-hot random softmax at init (entropy ~0.9 nats over
            # 64-128 keys); q_norm at head_dim**-0.5 is the usual 1/sqrt(d) scale (entropy ~3.8).
            if qnorm_init and name.endswith("self_attn.q_norm.weight"):
                p.fill_(qnorm_init)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "python", "yoco_rs", "default_model"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=576)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--qnorm-init", type=float, default=0.177,
                    help="q_norm weight at init (0.177 = head_dim**-0.5, the usual 1/sqrt(d) attention scale; 0: HF's 1.0)")
    ap.add_argument("--induction-steps", type=int, default=250,
                    help="warm-up steps on repeated random sequences before the main mix (0: none)")
    ap.add_argument("--induction-batch", type=int, default=32)
    ap.add_argument("--induction-seq", type=int, default=64)
    ap.add_argument("--induction-window", type=int, default=4,
                    help="sliding window during the warm-up: below the repeat distance, so the induction "
                         "heads form in the full-attention layers, the ones long-context recall needs")
    ap.add_argument("--recall-batch", type=int, default=8,
                    help="rows per step of the auxiliary dense-recall batch (loss on the answers only; 0: none)")
    ap.add_argument("--recall-seq", type=int, default=512)
    ap.add_argument("--recall-weight", type=float, default=1.0)
    ap.add_argument("--recall-chat", type=float, default=0.25,
                    help="share of the dense-recall episodes asked as a chat turn")
    ap.add_argument("--max-queries", type=int, default=8, help="recall questions per episode: 2..N")
    ap.add_argument("--probe-every", type=int, default=0,
                    help="every N main steps, teacher-forced retrieval accuracy on evals/data/recall.jsonl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared 2-core machine two threads thrash; the result depends on it)")
    ap.add_argument("--time-budget-s", type=float, default=0, help="stop early after this long (0: never)")
    args = ap.parse_args()

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import Gemma3nForCausalLM

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    docs = data.documents("train")
    tok = train_tokenizer(docs)
    cfg = write_configs(args.out, tok)
    cfg._attn_implementation = "sdpa"
    print(f"data: {len(docs)} train documents, {sum(len(t) for _, t in docs)} chars; tokenizer "
          f"{tok.get_vocab_size()} pieces ({time.time() - t0:.0f}s)", flush=True)

    model = Gemma3nForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    opt = init_and_optimizer(model, args.lr, args.qnorm_init)
    batches = Batches(tok, docs, args.seq, args.seed, args.max_queries, args.recall_chat)
    print(f"model: {n_params} parameters; recall words: {len(batches.keys)} keys, {len(batches.values)} values",
          flush=True)
    log, t_train = [], time.time()
    model.train()
    model.config.sliding_window = args.induction_window
    for step in range(args.induction_steps):
        x, y = induction_batch(step, args.induction_batch, args.induction_seq, args.seed)
        loss = model(input_ids=x, labels=y, use_cache=False).loss
        optimizer_step(model, opt, loss, args.lr * min(1.0, (step + 1) / 20))
        if step % 10 == 0 or step == args.induction_steps - 1:
            el = time.time() - t_train
            log.append({"induction_step": step, "loss": round(loss.item(), 4), "elapsed_s": round(el, 1)})
            print(f"induction step {step} loss {loss.item():.4f} {el:.0f}s", flush=True)
    model.config.sliding_window = WINDOW
    probe = None
    if args.probe_every:
        import recall_experiment

        rows = [json.loads(line) for line in open(os.path.join(ROOT, "evals", "data", "recall.jsonl"))]
        by_mult = {m: [r for r in rows if r["multiple"] == m][:40] for m in (2, 4, 8)}
        probe = lambda: recall_experiment.probe(model, tok, by_mult, WINDOW)  # noqa: E731
    step = 0
    for step in range(args.steps):
        x = batches.batch(step, args.batch)
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1].clone(), use_cache=False).loss
        # (HF shifts labels by one inside; the last input token's target is dropped.)
        total = loss
        if args.recall_batch:
            rx, ry = batches.recall_batch(step, args.recall_batch, args.recall_seq)
            rloss = labelled_loss(model, rx, ry)
            total = loss + args.recall_weight * rloss
        optimizer_step(model, opt, total, lr_at(step, args.steps, args.lr, warmup=min(40, args.steps // 10 + 1)))
        if step % 10 == 0 or step == args.steps - 1:
            el = time.time() - t_train
            log.append({"step": step, "loss": round(loss.item(), 4), "elapsed_s": round(el, 1)})
            if args.recall_batch:
                log[-1]["recall_loss"] = round(rloss.item(), 4)
            print(f"step {step} loss {loss.item():.4f} " + (f"recall {rloss.item():.3f} " if args.recall_batch else "")
                  + f"lr {opt.param_groups[0]['lr']:.2e} {el:.0f}s", flush=True)
        if probe and (step + 1) % args.probe_every == 0:
            print(f"probe step {step + 1}: " + " ".join(f"{m}x {a:.2f}" for m, a in probe().items()), flush=True)
        if args.save_every and step and step % args.save_every == 0:
            save_weights(model, args.out)  # a usable checkpoint while the run goes on
        if args.time_budget_s and time.time() - t_train > args.time_budget_s:
            print(f"time budget reached after step {step}", flush=True)
            break

    model.eval()
    save_weights(model, args.out)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump({"args": vars(args) | {"out": os.path.relpath(args.out, ROOT)}, "steps_done": step + 1,
                   "parameters": n_params, "train_seconds": round(time.time() - t_train, 1),
                   "total_seconds": round(time.time() - t0, 1), "python": platform.python_version(),
                   "torch": torch.__version__, "tokens_per_step": args.batch * args.seq, "log": log},
                  f, indent=1)
        f.write("\n")
    print(f"done: {step + 1} steps in {time.time() - t_train:.0f}s; wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
