"""The mock executor bound from Rust: deterministic, plan-sensitive, with a timing model."""

import numpy as np
import pytest

from yoco_rs._core import MockExecutor, Scheduler


def one_step(prompt, **mock_kw):
    s = Scheduler(["full"], num_blocks=64, block_size=16, max_model_len=128)
    s.add_request(1, prompt, max_tokens=4)
    m = MockExecutor(1000, first_token=16, **mock_kw)
    p = s.schedule()
    return m, p, m.sample(p)


def test_plain_mock_samples_from_the_last_token_and_position():
    m, p, a = one_step([5, 6, 7])
    assert a.dtype == np.int32 and a.shape == (1,) and 16 <= a[0] < 1000
    assert a[0] == m.reference_next([1, 2, 7]), "plain mode reads only the last id and its position"
    assert a[0] != m.reference_next([5, 6, 8])
    assert a[0] != m.reference_next([5, 7])
    assert one_step([5, 6, 7])[2][0] == a[0], "deterministic"


def test_kv_mock_depends_on_the_whole_prefix():
    s = Scheduler(["full"], num_blocks=64, block_size=16, max_model_len=128)
    m = MockExecutor(1000, scheduler=s)
    assert m.simulates_kv
    s.add_request(1, [5, 6, 7], max_tokens=4)
    a = m.sample(s.schedule())
    assert a[0] == m.reference_next([5, 6, 7]) != m.reference_next([4, 6, 7])


def test_timing_model_accumulates_modelled_time():
    m, p, _ = one_step(list(range(20, 30)), base_us=100.0, per_token_us=2.0, per_cross_row_us=5.0)
    assert m.modelled_us == pytest.approx(100 + 2 * 10 + 5 * 1)


def test_bad_mock_arguments_raise_value_error():
    with pytest.raises(ValueError, match="first_token"):
        MockExecutor(10, first_token=10)
    with pytest.raises(ValueError, match="empty"):
        MockExecutor(10).reference_next([])
