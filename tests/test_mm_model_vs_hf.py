"""Image and audio inputs against transformers on a tiny random ``Gemma3nForConditionalGeneration``
(tests/mm_tiny.py): the processor equals ``Gemma3nProcessor`` (ids, pixels, log-mel features), and the
Engine's logits for image+text and audio+text prompts equal transformers' forward within float32
tolerance, fast prefill on and off, with chunks that split the placeholder runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mm_tiny import AUDIO_TOKENS, IMAGE_SIZE, VISION_TOKENS, random_audio, random_image
from numerics import hf_tol
from yoco_rs import Engine, SamplingParams

PROMPT_IMAGE = ("<start_of_turn>user\nWhat is in <image_soft_token> this picture?<end_of_turn>\n"
                "<start_of_turn>model\n")
PROMPT_AUDIO = "<start_of_turn>user\nTranscribe <audio_soft_token> please.<end_of_turn>\n<start_of_turn>model\n"
PROMPT_BOTH = "<start_of_turn>user\n<image_soft_token> and <audio_soft_token>, twice <image_soft_token><end_of_turn>\n"


def hf_processor(path):
    from transformers import Gemma3nProcessor, PreTrainedTokenizerFast, SiglipImageProcessor
    from transformers.models.gemma3n.feature_extraction_gemma3n import Gemma3nAudioFeatureExtractor

    tok = PreTrainedTokenizerFast(
        tokenizer_file=f"{path}/tokenizer.json", bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        extra_special_tokens={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                              "eoi_token": "<end_of_image>", "audio_token": "<audio_soft_token>",
                              "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>"})
    ip = SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_normalize=False, resample=2)
    return Gemma3nProcessor(feature_extractor=Gemma3nAudioFeatureExtractor(), image_processor=ip, tokenizer=tok,
                            audio_seq_length=AUDIO_TOKENS, image_seq_length=VISION_TOKENS)


@pytest.fixture(scope="module")
def engines(tiny_mm):
    path, _ = tiny_mm
    out = {}
    for fast in (True, False):
        # 16-token steps: every placeholder run (16 image, 12 audio tokens) is split across chunks
        out[fast] = Engine(path, max_num_batched_tokens=16, block_size=16, kv_cache_memory=32 << 20,
                           kv_sharing_fast_prefill=fast, max_model_len=512)
    yield out
    for e in out.values():
        e.close()


def engine_prompt_logits(engine, prompt: dict) -> tuple[torch.Tensor, list[int]]:
    """Logits at every prompt position through the whole engine path (processor, core plan with chunked
    prefill, encoder overlay, model), captured from the runner; and the prompt ids."""
    got = []
    runner = engine._runner
    orig = runner.execute

    def capture(batch):
        logits = orig(batch)
        got.append(logits.detach().clone())
        return logits

    runner.execute = capture
    try:
        out = engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0), use_tqdm=False)
    finally:
        runner.execute = orig
    return torch.cat(got), out[0].prompt_token_ids


def test_processor_expands_and_preprocesses_like_gemma3n_processor(tiny_mm, engines):
    path, _ = tiny_mm
    proc = engines[True].mm_processor
    ref = hf_processor(path)
    img, wave = random_image(1), random_audio(1, 1.2)
    text = "<bos>" + PROMPT_BOTH
    r = ref(text=[text], images=[[img, random_image(2)]], audio=[wave], return_tensors="pt")
    items = proc.process({"image": [img, random_image(2)], "audio": (wave, 16000)})
    ids = engines[True].tokenizer.encode(proc.expand_text(text, items))
    assert ids == r["input_ids"][0].tolist()
    pix = torch.cat([it.inputs["pixel_values"] for it in items if it.modality == "image"])
    assert torch.equal(pix, r["pixel_values"])
    audio = [it for it in items if it.modality == "audio"][0]
    assert torch.equal(audio.inputs["input_features"], r["input_features"])
    assert torch.equal(audio.inputs["input_features_mask"], r["input_features_mask"])
    proc.locate(ids, items)
    starts = {t: [i for i in range(1, len(ids)) if ids[i] == t and ids[i - 1] != t] for t in (4099, 4101)}
    assert [it.offset for it in items] == starts[4099] + starts[4101]
    assert len(starts[4099]) == 2 and all(ids[s:s + VISION_TOKENS] == [4099] * VISION_TOKENS for s in starts[4099])


@pytest.mark.parametrize("fast_prefill", [True, False], ids=["fast_prefill", "full_prefill"])
@pytest.mark.parametrize("kind", ["image", "audio"])
def test_prompt_logits_equal_transformers(tiny_mm, engines, fast_prefill, kind):
    path, hf = tiny_mm
    engine = engines[fast_prefill]
    if kind == "image":
        img = random_image(3)
        prompt = {"prompt": PROMPT_IMAGE, "multi_modal_data": {"image": img}}
        r = hf_processor(path)(text=["<bos>" + PROMPT_IMAGE], images=[[img]], return_tensors="pt")
        kw = {"pixel_values": r["pixel_values"]}
    else:
        wave = random_audio(4, 1.5)
        prompt = {"prompt": PROMPT_AUDIO, "multi_modal_data": {"audio": (wave, 16000)}}
        r = hf_processor(path)(text=["<bos>" + PROMPT_AUDIO], audio=[wave], return_tensors="pt")
        kw = {"input_features": r["input_features"], "input_features_mask": r["input_features_mask"]}
    logits, ids = engine_prompt_logits(engine, prompt)
    assert ids == r["input_ids"][0].tolist()
    with torch.no_grad():
        want = hf(input_ids=r["input_ids"], **kw).logits[0].float()
    assert logits.shape == want.shape
    tol = hf_tol(10, 128)
    diff = (logits - want).abs().max().item()
    assert diff <= tol, f"max |logits - transformers| = {diff:.3g} > {tol:.3g}"
    # the media matter: the same text with another item gives other logits after the run
    other = dict(prompt, multi_modal_data={"image": random_image(9)} if kind == "image"
                 else {"audio": (random_audio(9, 1.5), 16000)})
    logits2, _ = engine_prompt_logits(engine, other)
    run_end = max(i for i, t in enumerate(ids) if t in (4099, 4101)) + 1
    assert (logits2[run_end:] - logits[run_end:]).abs().max() > 1e-3
    first = min(i for i, t in enumerate(ids) if t in (4099, 4101))
    assert torch.equal(logits2[:first], logits[:first])


def test_greedy_tokens_equal_transformers_generate(tiny_mm, engines):
    path, hf = tiny_mm
    img, wave = random_image(5), random_audio(6, 1.0)
    text = "<start_of_turn>user\n<image_soft_token> <audio_soft_token> say<end_of_turn>\n<start_of_turn>model\n"
    r = hf_processor(path)(text=["<bos>" + text], images=[[img]], audio=[wave], return_tensors="pt")
    with torch.no_grad():
        ref = hf.generate(**{k: v for k, v in r.items() if k != "token_type_ids"}, max_new_tokens=6, do_sample=False)
    want = ref[0, r["input_ids"].shape[1]:].tolist()
    for fast, engine in engines.items():
        out = engine.generate({"prompt": text, "multi_modal_data": {"image": img, "audio": (wave, 16000)}},
                              SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), use_tqdm=False)
        assert out[0].outputs[0].token_ids == want, f"fast_prefill={fast}"
        engine.check_invariants()
    assert np.isfinite(want).all()
