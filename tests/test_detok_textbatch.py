"""The Rust TextBatch as the engine uses it: one call per step over flat arrays."""

import numpy as np
import pytest

from yoco_rs import _core, bundled
from yoco_rs.tokenizer import Tokenizer

TOK_JSON = str(bundled._SRC / "tokenizer.json")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(str(bundled._SRC))


def test_a_step_over_many_requests_streams_each_ones_text(tok):
    tb = _core.TextBatch(TOK_JSON)
    texts = ["hello world", "the cache is warm", "one two three"]
    seqs = [tok.encode(t, add_special_tokens=False) for t in texts]
    for i in range(3):
        tb.add(i, [2], stream=True)
    got = ["", "", ""]
    for step in range(max(map(len, seqs))):
        live = [i for i in range(3) if step < len(seqs[i])]
        ids = np.array(live, dtype=np.uint64)
        toks = np.array([seqs[i][step] for i in live], dtype=np.int32)
        fin = np.array([3 if step == len(seqs[i]) - 1 else 0 for i in live], dtype=np.uint8)
        didx, deltas, sidx, _ = tb.step(ids, toks, fin)
        assert len(sidx) == 0
        for k, d in zip(didx.tolist(), deltas):
            got[live[k]] += d
    assert got == texts
    assert [tb.take(i)[0] for i in range(3)] == texts and len(tb) == 0


def test_stop_string_reports_position_and_which(tok):
    tb = _core.TextBatch(TOK_JSON)
    ids = tok.encode("alpha beta gamma delta", add_special_tokens=False)
    tb.add(5, [], stop=["zzz", "gamma"], stream=False)
    ids_so_far = []
    for k, t in enumerate(ids):
        ids_so_far.append(t)
        didx, deltas, sidx, which = tb.step(np.array([5], np.uint64), np.array([t], np.int32), np.zeros(1, np.uint8))
        assert len(didx) == 0  # not streaming
        if len(sidx):
            assert which.tolist() == [1]
            break
    text, ids = tb.take(5)
    assert text == "alpha beta " and ids.tolist() == ids_so_far


def test_mismatched_lengths_and_duplicates_are_value_errors():
    tb = _core.TextBatch(TOK_JSON)
    tb.add(1, [])
    with pytest.raises(ValueError, match="already registered"):
        tb.add(1, [])
    with pytest.raises(ValueError, match="one length"):
        tb.step(np.array([1], np.uint64), np.array([], np.int32), np.zeros(1, np.uint8))


def test_decode_each_matches_the_python_tokenizer(tok):
    tb = _core.TextBatch(TOK_JSON)
    ids = tok.encode("Hello world café", add_special_tokens=True)
    assert tb.decode(ids) == tok.decode(ids)
    assert tb.decode_each(ids[:3]) == [tok.decode([i], skip_special_tokens=False) for i in ids[:3]]
