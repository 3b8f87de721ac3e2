"""The bundled model's training and evaluation data, from text that ships with Python (no downloads).

* English: ``pydoc_data.topics`` (the language reference pages ``help()`` shows) and the docstrings of
  the standard library's modules, classes and functions, read with ``ast`` from the installed
  standard library's sources (no imports, so no side effects). A document's name (topic or dotted
  qualname) fixes its split: ``held_out(name)`` puts ~5% aside for evaluation, never trained on.
* Long-context retrieval ("associative recall"): key/value facts ``- key = value`` scattered between
  filler lines of English over a context several times the sliding window, then a ``Recall:`` section
  that asks for some keys again (``- key =`` -> `` value``). Answering from beyond the 64-token window
  needs the full-attention layers (and in the last layers, the KV they share).
* Chat: Gemma-template turns ("What does json.dumps do?" -> the docstring's first paragraph) and
  retrieval asked as a chat turn.

Everything is a pure function of a ``random.Random`` seed and the Python version's standard library.
Used by ``scripts/train_default_model.py`` and by the evaluations in ``evals/``.
"""

from __future__ import annotations

import ast
import hashlib
import os
import random
import sysconfig

def task_words(tokenizer) -> tuple[list[str], list[str]]:
    """The retrieval task's vocabulary: lowercase words of 4+ letters that are one piece of the
    tokenizer after a space, in id order, alternately keys and values (400 each at most)."""
    vocab = tokenizer.get_vocab()
    words = sorted((i, p[1:]) for p, i in vocab.items()
                   if p.startswith("\u2581") and len(p) >= 5 and p[1:].isascii() and p[1:].isalpha() and p[1:].islower())
    words = [w for _, w in words]
    return words[0::2][:400], words[1::2][:400]


def _stdlib_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("test", "tests", "idle_test", "site-packages",
                                                      "__pycache__", "lib2to3", "ensurepip", "turtledemo"))
        out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".py")]
    return sorted(out), root


def stdlib_docstrings() -> list[tuple[str, str]]:
    """(dotted name, cleaned docstring) for every module, class and function of the standard library
    with a docstring of at least 60 characters, in a fixed order."""
    files, root = _stdlib_files()
    out = []
    for path in files:
        mod = os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue

        def walk(node, prefix):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) >= 60:
                out.append((prefix, doc.strip()))
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    walk(child, f"{prefix}.{child.name}")

        walk(tree, mod)
    return out


def pydoc_topics() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(f"topic:{k}", topics[k].strip()) for k in sorted(topics)]


def held_out(name: str) -> bool:
    """~5% of documents, chosen by a hash of their name: evaluation only."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 20 == 0


def documents(split: str) -> list[tuple[str, str]]:
    """``split`` is "train" or "heldout"."""
    docs = pydoc_topics() + stdlib_docstrings()
    want = split == "heldout"
    return [(n, t) for n, t in docs if held_out(n) == want]


def first_paragraph(text: str, limit: int = 400) -> str:
    p = text.split("\n\n")[0].replace("\n", " ").strip()
    return p[:limit]


def filler(rng: random.Random, docs: list[tuple[str, str]]) -> str:
    """A run of 1-3 non-empty lines from a random document (<= 240 characters)."""
    _, text = docs[rng.randrange(len(docs))]
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    i = rng.randrange(len(lines))
    return " ".join(lines[i:i + rng.randint(1, 3)])[:240]


def fact(key: str, value: str) -> str:
    return f"- {key} = {value}\n"


def recall_episode(rng: random.Random, docs, target_tokens: int, count_tokens, keys, values,
                   n_queries: int, far_from: int = 0):
    """(context, [(key, value) asked]) where context is filler with facts up to ~target_tokens tokens
    (``count_tokens(str) -> int``). ``far_from`` > 0: every asked fact lies in the context's first
    part, at least ``far_from`` tokens before its end (beyond a sliding window of that size)."""
    pieces, facts, n = [], [], 0
    keys = list(keys)
    rng.shuffle(keys)
    while n < target_tokens:
        if keys and rng.random() < 0.4:
            k, v = keys.pop(), rng.choice(values)
            pieces.append(fact(k, v))
            facts.append((k, v, n))
        else:
            pieces.append(filler(rng, docs) + "\n")
        n += count_tokens(pieces[-1])
    eligible = [(k, v) for k, v, at in facts if n - at > far_from] if far_from else [(k, v) for k, v, _ in facts]
    if not eligible:
        return None
    asked = rng.sample(eligible, min(n_queries, len(eligible)))
    return "".join(pieces), asked


def recall_query(key: str) -> str:
    return f"Recall:\n- {key} ="


__all__ = ["task_words", "documents", "held_out", "filler", "fact", "recall_episode", "recall_query",
           "first_paragraph", "stdlib_docstrings", "pydoc_topics"]
