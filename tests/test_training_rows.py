"""The bundled model's training rows (``scripts/train_default_model.py``): the induction warm-up labels
exactly the repeated tokens, and the dense-recall rows label exactly each question's answer, so the
retrieval loss is the lookup and nothing else."""

import pathlib
import random
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tdm():
    sys.path.insert(0, str(ROOT / "scripts"))
    import train_default_model

    return train_default_model


def test_induction_rows_label_only_the_repeats_of_a_random_sequence(tdm):
    for seed in range(20):
        ids, labels = tdm.induction_row(random.Random(seed), 64)
        assert len(ids) == len(labels) == 65 and ids[0] == 2
        first = next(i for i, t in enumerate(labels) if t != -100)
        period = first - 1
        assert 16 <= period <= 32
        assert all(t == -100 for t in labels[:first])
        assert labels[first:] == ids[first:]
        # every labelled token is the one a period earlier: predictable only by looking back
        assert all(ids[i] == ids[i - period] for i in range(first, len(ids)))
        assert all(len(tdm.SPECIALS) + 256 <= t < tdm.VOCAB_SIZE for t in ids[1:])


def test_dense_recall_rows_label_every_answer_and_nothing_else(tdm):
    from tokenizers import Tokenizer

    from yoco_rs import bundled

    tok = Tokenizer.from_file(str(pathlib.Path(bundled.default_model_dir()) / "tokenizer.json"))
    batches = tdm.Batches(tok, tdm.data.documents("train")[:300], 576, seed=0)
    chat_replies = 0
    for seed in range(12):
        ids, labels = batches.dense_recall_row(random.Random(seed), 256)
        assert len(ids) == len(labels) == 257
        answered = [i for i, t in enumerate(labels) if t != -100]
        assert [labels[i] for i in answered] == [ids[i] for i in answered]
                # each run of labelled tokens spells the value stated earlier for the key asked just before it
        runs = []
        for i in answered:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for run in runs:
            before = tok.decode(ids[1:run[0]])
            key = re.search(r"- (\w+) =(?:\s*model\n)?$", before).group(1)  # a chat episode: the reply turn
            stated = re.findall(rf"^- {key} = (\w+)$", before, re.M)
            got = tok.decode([ids[i] for i in run]).strip()
            if ids[run[-1]] == 5:  # <end_of_turn>: a chat reply (" value<end_of_turn>"), labelled whole
                chat_replies += 1
                assert ids[run[0] - 1] == tok.token_to_id("model\n") and len(run) >= 2
            assert stated and (got == stated[-1] or (run[-1] == len(ids) - 1 and stated[-1].startswith(got)))
        assert runs
        # and every question of the row (a "- key =" line after "Recall:") is labelled
        text = tok.decode(ids[1:])
        questions = sum(1 if re.match(r"- \w+ =\s*model", part)  # a chat episode: one question
                        else len(re.findall(r"^- \w+ = \w+$", part.split("\n\n")[0], re.M))
                        for part in text.split("Recall:\n")[1:])
        assert len(runs) >= questions - 1  # the row's cut may end inside the last answer
    assert chat_replies >= 1  # some episodes are asked as a chat turn
