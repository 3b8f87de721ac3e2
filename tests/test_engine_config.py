"""EngineConfig validation: errors name the field and a value that would work."""

import pytest

from yoco_rs import EngineConfig


def test_defaults_are_auto():
    c = EngineConfig()
    assert c.model is None and c.dtype == "auto" and c.device == "auto"
    assert c.enable_prefix_caching and c.kv_sharing_fast_prefill


@pytest.mark.parametrize(
    "kw,fragment",
    [
        (dict(dtype="fp8"), "dtype must be one of auto, float32, bfloat16, float16"),
        (dict(device="tpu"), "device must be auto, cpu, cuda or cuda:N"),
        (dict(max_model_len=0), "max_model_len must be an integer >= 1"),
        (dict(block_size=24), "block_size must be a power of two"),
        (dict(block_size=16, sub_block_size=6), "sub_block_size must be a divisor of block_size=16 ([1, 2, 4, 8, 16])"),
        (dict(kv_cache_memory=1.5), "kv_cache_memory must be a fraction in (0, 1]"),
        (dict(kv_cache_memory=-5), "kv_cache_memory must be a positive number of bytes"),
        (dict(num_gpu_blocks_override=0), "num_gpu_blocks_override must be an integer >= 1"),
        (dict(scheduling_policy="lifo"), "scheduling_policy must be fcfs or priority"),
    ],
)
def test_bad_setting_is_a_value_error_naming_what_works(kw, fragment):
    with pytest.raises(ValueError) as e:
        EngineConfig(**kw)
    assert fragment in str(e.value)


def test_unknown_keyword_lists_the_known_ones():
    with pytest.raises(TypeError, match="unknown engine setting.*gpu_memory_utilisation.*known"):
        EngineConfig.from_kwargs(None, gpu_memory_utilisation=0.9)
