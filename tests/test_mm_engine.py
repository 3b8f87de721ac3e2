"""Image and audio requests through the Engine: prefix caching that knows which item a placeholder run
held, chunked prefill across runs, the encoder cache under pressure, no leaks after aborts, and the
Python API's errors."""

from __future__ import annotations

import numpy as np
import pytest

from engine_util import assert_pool_drained, run_until_done
from mm_tiny import random_audio, random_image
from yoco_rs import Engine, SamplingParams

TEXT = ("<start_of_turn>user\nDescribe <image_soft_token> in a few words, then more words after it so the prompt "
        "runs on.<end_of_turn>\n<start_of_turn>model\n")


def greedy(n=4):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def image_prompt(seed, text=TEXT):
    return {"prompt": text, "multi_modal_data": {"image": random_image(seed)}}


@pytest.fixture(scope="module")
def engine(tiny_mm):
    e = Engine(tiny_mm[0], block_size=16, sub_block_size=4, max_num_batched_tokens=32, kv_cache_memory=32 << 20,
               max_model_len=512, limit_mm_per_prompt={"image": 2, "audio": 1})
    yield e
    e.close()


def run(engine, prompt, n=4):
    return engine.generate(prompt, greedy(n), use_tqdm=False)[0]


def test_same_image_twice_hits_the_prefix_cache(engine):
    engine.reset_prefix_cache()
    a = run(engine, image_prompt(11))
    b = run(engine, image_prompt(11))
    assert a.num_cached_tokens == 0
    # everything but the last prompt token's sub-block (4 tokens) comes from the cache
    p = len(b.prompt_token_ids)
    assert b.num_cached_tokens == (p - 1) // 4 * 4
    assert b.outputs[0].token_ids == a.outputs[0].token_ids


def test_another_image_misses_from_the_placeholder_start(engine):
    engine.reset_prefix_cache()
    a = run(engine, image_prompt(12))
    b = run(engine, image_prompt(13))
    start = b.prompt_token_ids.index(4099)
    # at most the sub-blocks wholly before the run are reused
    assert a.num_cached_tokens == 0
    assert 0 < b.num_cached_tokens <= start // 4 * 4
    assert b.num_cached_tokens == start // 4 * 4
    # the text alone (the placeholder ids without the image) does not reuse the image's blocks either
    ids = list(a.prompt_token_ids)
    c = engine.generate({"prompt_token_ids": ids}, greedy(), use_tqdm=False)[0]
    assert c.num_cached_tokens == start // 4 * 4


def test_chunked_prefill_across_the_run_gives_identical_tokens(tiny_mm, engine):
    want = run(engine, image_prompt(14), n=6).outputs[0].token_ids
    # one chunk for the whole prompt, no prefix cache, fast prefill off: the same tokens
    with Engine(tiny_mm[0], block_size=16, max_num_batched_tokens=512, enable_prefix_caching=False,
                kv_sharing_fast_prefill=False, kv_cache_memory=32 << 20, max_model_len=512) as whole:
        assert run(whole, image_prompt(14), n=6).outputs[0].token_ids == want
    # a prefix hit that ends inside the run (sub-block copy-on-match), then the rest: still the same
    engine.reset_prefix_cache()
    p = image_prompt(14)
    first = run(engine, p, n=6)
    again = run(engine, p, n=6)
    assert again.num_cached_tokens > first.prompt_token_ids.index(4099)
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == want


def test_encoder_cache_frees_under_pressure_and_results_do_not_change(tiny_mm, engine):
    one_item = 16 * 128 * 4  # 16 soft tokens x hidden 128, float32
    with Engine(tiny_mm[0], block_size=16, sub_block_size=4, max_num_batched_tokens=32, kv_cache_memory=32 << 20,
                max_model_len=512, encoder_cache_memory=2 * one_item, enable_prefix_caching=False) as small:
        outs = small.generate([image_prompt(20 + i) for i in range(5)], greedy(), use_tqdm=False)
        st = small._mm.cache.stats()
        assert st["bytes"] <= 2 * one_item and st["entries"] <= 2
        assert st["evictions"] >= 3
        want = engine.generate([image_prompt(20 + i) for i in range(5)], greedy(), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in want]
        assert_pool_drained(small)


def test_a_storm_of_multimodal_requests_with_aborts_leaks_nothing(engine):
    rng = np.random.default_rng(0)
    ids = []
    for i in range(12):
        data = {"image": random_image(int(rng.integers(0, 4)))}
        if i % 3 == 0:
            data["audio"] = (random_audio(i, 0.8), 16000)
            text = TEXT.replace("in a few", "<audio_soft_token> in a few")
        else:
            text = TEXT
        rid = f"storm-{i}"
        engine.add_request(rid, {"prompt": text, "multi_modal_data": data}, greedy(8))
        ids.append(rid)
    for step in range(6):
        engine.step()
        engine.abort_request(ids[step::6][:1])  # abort some mid-prefill, some while decoding
    run_until_done(engine)
    assert_pool_drained(engine)
    assert engine._mm.num_requests() == 0


def test_python_api_errors_name_the_problem(tiny_mm, engine):
    with pytest.raises(ValueError, match="placeholder"):
        engine.generate({"prompt": "no placeholder here", "multi_modal_data": {"image": random_image(1)}})
    with pytest.raises(ValueError, match="at most 2 per prompt"):
        engine.generate({"prompt": TEXT, "multi_modal_data": {"image": [random_image(1)] * 3}})
    with pytest.raises(ValueError, match="unknown modality"):
        engine.generate({"prompt": TEXT, "multi_modal_data": {"video": 1}})
    with pytest.raises(ValueError, match="at most"):
        engine.generate({"prompt": TEXT.replace("<image_soft_token>", "<audio_soft_token>"),
                         "multi_modal_data": {"audio": (random_audio(1, 5.0), 16000)}})
    with pytest.raises(ValueError, match="sample_rate"):
        engine.generate({"prompt": TEXT.replace("<image_soft_token>", "<audio_soft_token>"),
                         "multi_modal_data": {"audio": (random_audio(1, 1.0), -5)}})
    assert_pool_drained(engine)


def test_a_text_only_model_refuses_multi_modal_data():
    with Engine(kv_cache_memory=16 << 20, max_model_len=256) as e:
        assert e.mm_processor is None
        with pytest.raises(ValueError, match="takes no image or audio"):
            e.generate({"prompt": "hi", "multi_modal_data": {"image": random_image(1)}})


def test_async_engine_gives_the_engine_s_tokens_for_image_prompts_and_frees_their_items(tiny_mm, engine):
    """The same images through AsyncEngine (the Rust step loop, items registered with its executor) give
    the Engine's tokens, the second request hits the prefix cache, and no item stays registered."""
    import asyncio

    from yoco_rs import AsyncEngine

    want = [run(engine, image_prompt(s)).outputs[0].token_ids for s in (21, 22)]

    async def main():
        async with AsyncEngine(tiny_mm[0], block_size=16, sub_block_size=4, max_num_batched_tokens=32,
                               kv_cache_memory=32 << 20, max_model_len=512,
                               limit_mm_per_prompt={"image": 2, "audio": 1}) as eng:
            outs = await asyncio.gather(*(eng.generate(image_prompt(s), greedy()) for s in (21, 22)))
            again = await eng.generate(image_prompt(21), greedy())
            return outs, again, eng._executor.num_media_requests()

    outs, again, live = asyncio.run(asyncio.wait_for(main(), 300))
    assert [o.outputs[0].token_ids for o in outs] == want
    assert again.outputs[0].token_ids == want[0] and again.num_cached_tokens > 0
    assert live == 0
