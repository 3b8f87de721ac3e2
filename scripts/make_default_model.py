"""Regenerate the bundled default model's package files (``python/yoco_rs/default_model/``).

    .venv/bin/python scripts/make_default_model.py

Writes config.json / generation_config.json (a tiny Gemma 3n text model, via transformers' config
class, so ``AutoConfig`` reads them), tokenizer.json (a Gemma-style byte-fallback BPE trained here
with ``tokenizers`` on a corpus generated from a fixed seed), tokenizer_config.json (special tokens
and a Gemma-style chat template) and weights_manifest.json (parameter names and shapes, in
``named_parameters`` order). The weights themselves are not stored: ``yoco_rs.bundled``
materializes them deterministically on first use (see there). Deterministic: rerunning it reproduces
the committed files.
"""

from __future__ import annotations

import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "python", "yoco_rs", "default_model")

VOCAB_SIZE = 2048
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]

MODEL = dict(
    vocab_size=VOCAB_SIZE, vocab_size_per_layer_input=1792,  # < vocab_size, like the real model
    hidden_size=128, hidden_size_per_layer_input=32,
    intermediate_size=256, num_hidden_layers=10,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
    num_kv_shared_layers=5,
    sliding_window=512,
    activation_sparsity_pattern=[0.95] * 3 + [0.0] * 7,
    laurel_rank=16, altup_num_inputs=4, altup_active_idx=0,
    max_position_embeddings=32768, final_logit_softcapping=30.0,
    pad_token_id=0, eos_token_id=1, bos_token_id=2,
)

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

_WORDS = """the a an this that these those some every each no one two three four five ten hundred
time year people way day man woman child world life hand part place case week company system program
question work government number night point home water room mother area money story fact month lot
right study book eye job word business issue side kind head house service friend father power hour
game line end member law car city community name president team minute idea kid body information back
parent face others level office door health person art war history party result change morning reason
research girl guy moment air teacher force education model engine token cache block prefix memory
request server client answer river mountain forest garden music letter paper table window street
be have do say go get make know think take see come want look use find give tell work call try ask
need feel become leave put mean keep let begin seem help talk turn start show hear play run move like
live believe hold bring happen write provide sit stand lose pay meet include continue set learn lead
understand watch follow stop create speak read allow add spend grow open walk win offer remember love
consider appear buy wait serve die send expect build stay fall cut reach kill remain suggest raise pass
good new first last long great little own other old right big high different small large next early
young important few public bad same able fast slow quick bright dark warm cold happy quiet simple
and or but if because when while although so then also very really just still already never always
often sometimes here there now today tomorrow yesterday in on at by with from about into over under
after before between through during without again""".split()

_CODE = [
    "def main():\n    print('hello world')\n",
    "for i in range(10):\n    total += i * i\n",
    "fn add(a: i32, b: i32) -> i32 { a + b }\n",
    "let cache = HashMap::new();\n",
    "SELECT name, count(*) FROM users GROUP BY name;\n",
    '{"role": "user", "content": "Hello!"}\n',
    "x = [1, 2, 3, 4, 5]\ny = {k: v for k, v in zip(x, x)}\n",
]


def corpus(seed: int = 1234, n_sentences: int = 6000) -> list[str]:
    """Pseudo-English sentences, numbers, punctuation, code and chat turns, from a fixed seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n_sentences):
        k = rng.randint(4, 16)
        words = [rng.choice(_WORDS) for _ in range(k)]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, k), str(rng.randint(0, 99999)))
        s = " ".join(words)
        s = s[0].upper() + s[1:] + rng.choice([".", ".", ".", "?", "!", ",", ":", ";"])
        if rng.random() < 0.1:
            s = f'"{s}" she said.'
        if rng.random() < 0.05:
            s = rng.choice(_CODE)
        if rng.random() < 0.05:
            s = f"<start_of_turn>user\n{s}<end_of_turn>\n<start_of_turn>model\n"
        out.append(s)
    # A little non-ASCII so common multi-byte characters get pieces (the rest falls back to bytes).
    out += ["café naïve résumé über straße", "日本語のテキスト 中文 한국어", "emoji 🙂 🚀 ✓ — “quotes” …"] * 20
    return out


def train_tokenizer():
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
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIALS + byte_tokens,
        show_progress=False,
        initial_alphabet=[],
        limit_alphabet=200,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    # The byte pieces were reserved as trainer special tokens only to pin their ids (6..261); like
    # Gemma's they must be ordinary vocabulary pieces (byte fallback, never skipped as special).
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in SPECIALS]
    for t in data["added_tokens"]:
        t["special"] = True
    tok = Tokenizer.from_str(json.dumps(data))
    for b in (0, 0x41, 0xFF):
        assert tok.token_to_id(f"<0x{b:02X}>") == len(SPECIALS) + b
    return tok


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import torch
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    tok = train_tokenizer()
    vocab = tok.get_vocab_size()
    model_kw = dict(MODEL)
    model_kw["vocab_size"] = VOCAB_SIZE  # rows beyond the trained vocabulary stay unused
    cfg = Gemma3nTextConfig(**model_kw)
    cfg.architectures = ["Gemma3nForCausalLM"]
    cfg.dtype = "float32"
    d = cfg.to_dict()
    d.pop("transformers_version", None)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(OUT, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 5], "pad_token_id": 0}, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(OUT, "tokenizer.json"), pretty=False)
    tok_cfg = {
        "tokenizer_class": "GemmaTokenizerFast",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False,
        "model_max_length": MODEL["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {"start_of_turn": "<start_of_turn>", "end_of_turn": "<end_of_turn>"},
    }
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
        f.write("\n")
    model = Gemma3nForCausalLM(cfg)
    manifest = {"seed": 0, "dtype": "float32",
                "params": [[n, list(p.shape)] for n, p in model.named_parameters()]}
    with open(os.path.join(OUT, "weights_manifest.json"), "w") as f:
        json.dump(manifest, f, indent=0)
        f.write("\n")
    print(f"wrote {OUT}: vocab {vocab}, {sum(p.numel() for p in model.parameters())} params")
    del torch


if __name__ == "__main__":
    main()
