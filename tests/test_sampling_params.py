"""SamplingParams validation: vLLM's defaults, and each out-of-range value is a ValueError naming the
field and the allowed range."""

import pytest

from yoco_rs import RequestOutputKind, SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.max_tokens, p.min_tokens, p.ignore_eos) == (16, 0, False)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.stop is None and p.stop_token_ids is None and p.seed is None
    assert p.logprobs is None and p.prompt_logprobs is None
    assert p.skip_special_tokens and not p.include_stop_str_in_output
    assert p.output_kind == RequestOutputKind.CUMULATIVE


@pytest.mark.parametrize(
    "field,value,fragment",
    [
        ("n", 0, "n must be an integer >= 1"),
        ("temperature", -0.1, "temperature must be a number >= 0"),
        ("top_p", 0, "top_p must be in (0, 1]"),
        ("top_p", 1.5, "top_p must be in (0, 1]"),
        ("top_k", -2, "top_k must be 0 or -1"),
        ("min_p", 1.1, "min_p must be in [0, 1]"),
        ("max_tokens", 0, "max_tokens must be an integer >= 1"),
        ("min_tokens", -1, "min_tokens must be an integer >= 0"),
        ("logprobs", -1, "logprobs must be an integer >= 0"),
        ("prompt_logprobs", -3, "prompt_logprobs must be an integer >= 0"),
        ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2]"),
        ("frequency_penalty", -2.5, "frequency_penalty must be in [-2, 2]"),
        ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
        ("seed", 1.5, "seed must be an integer"),
        ("stop", [""], "stop must be a non-empty string"),
        ("stop_token_ids", [-1], "stop_token_ids must be a list of token ids >= 0"),
        ("temperature", float("nan"), "temperature must be a number >= 0"),
        ("n", True, "n must be an integer >= 1"),
    ],
)
def test_out_of_range_value_is_a_value_error_naming_field_and_range(field, value, fragment):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    assert fragment in str(e.value)
    shown = value[0] if isinstance(value, list) else value  # lists report the offending element
    assert repr(shown) in str(e.value)


def test_min_tokens_above_max_tokens_names_the_limit():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens \(4\), got 5"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_both_disabled_top_k_spellings_are_accepted():
    assert SamplingParams(top_k=-1).top_k == -1
    assert SamplingParams(top_k=0).top_k == 0


def test_stop_string_becomes_a_list_and_temperature_zero_is_greedy():
    p = SamplingParams(stop="###", temperature=0.0)
    assert p.stop == ["###"] and p.greedy
    assert not SamplingParams(temperature=0.5).greedy


def test_replace_revalidates():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams().replace(top_p=0.0)


def test_engine_limits_are_checked_at_submission():
    with pytest.raises(ValueError, match=r"logprobs must be <= max_logprobs \(20\), got 21"):
        SamplingParams(logprobs=21).check_against(max_logprobs=20, vocab_size=100)
    with pytest.raises(ValueError, match=r"stop_token_ids must be token ids in \[0, 100\), got 100"):
        SamplingParams(stop_token_ids=[100]).check_against(max_logprobs=20, vocab_size=100)


def test_output_kind_accepts_ints():
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind=7)
