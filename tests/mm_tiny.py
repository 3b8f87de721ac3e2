"""A tiny random multimodal Gemma 3n (``Gemma3nForConditionalGeneration``) saved with transformers'
``save_pretrained``: the tiny-10L text decoder (tests/tiny.py), timm's real MobileNetV5 encoder
architecture shrunk (channel multiplier 1/8, a 4 x 4 output: 16 soft tokens from a 64 x 64 image), a
two-layer conformer audio encoder (12 soft tokens: clips up to ~1.9 s), and the bundled tokenizer with
the six multimodal tokens appended, laid out as the real checkpoint's (begin tokens in the text
vocabulary, end and placeholder tokens at the start of the vision and audio vocabularies)."""

from __future__ import annotations

import io
import json
import os
import shutil

import numpy as np
import torch

from yoco_rs import bundled

BOI, BOA, EOI, IMAGE, EOA, AUDIO = 4096, 4097, 4098, 4099, 4100, 4101
MM_TOKENS = ["<start_of_image>", "<start_of_audio>", "<end_of_image>", "<image_soft_token>", "<end_of_audio>",
             "<audio_soft_token>"]
IMAGE_SIZE = 64
VISION_TOKENS = 16
AUDIO_TOKENS = 12

CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<image_soft_token>' }}"
    "{%- elif item['type'] == 'audio' -%}{{ '<audio_soft_token>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def mm_config():
    from tiny import tiny_config
    from transformers import Gemma3nAudioConfig, Gemma3nConfig, Gemma3nVisionConfig

    text = tiny_config(vocab_size=4102, vocab_size_per_layer_input=4098, max_position_embeddings=4096)
    vision = Gemma3nVisionConfig(architecture="mobilenetv5_300m_enc", hidden_size=2048, vocab_size=2,
                                 vocab_offset=EOI,
                                 model_args={"channel_multiplier": 0.125, "msfa_output_resolution": 4})
    audio = Gemma3nAudioConfig(vocab_size=2, vocab_offset=EOA, hidden_size=64, conf_num_hidden_layers=2,
                               conf_num_attention_heads=4, sscp_conv_channel_size=[16, 8])
    cfg = Gemma3nConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=audio.to_dict(),
                        audio_soft_tokens_per_image=AUDIO_TOKENS, vision_soft_tokens_per_image=VISION_TOKENS,
                        boi_token_id=BOI, eoi_token_id=EOI, image_token_id=IMAGE, boa_token_id=BOA,
                        eoa_token_id=EOA, audio_token_id=AUDIO)
    # eager attention like the text-only oracle (tests/tiny.py): SDPA sums in another order
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    return cfg


def tiny_mm_hf_model(seed: int = 0):
    """A randomized ``Gemma3nForConditionalGeneration`` (float32, eval): the text decoder and the embedders
    re-randomized like tests/tiny.py, the towers with their own (timm / transformers) random init."""
    from tiny import randomize
    from transformers import Gemma3nForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma3nForConditionalGeneration(mm_config()).eval()
    for part in (model.model.language_model, model.model.embed_vision, model.model.embed_audio):
        randomize(part, seed=seed)
    return model


def write_tokenizer(path: str) -> None:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(bundled._SRC / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MM_TOKENS])
    for t, want in zip(MM_TOKENS, (BOI, BOA, EOI, IMAGE, EOA, AUDIO)):
        assert tok.token_to_id(t) == want, (t, tok.token_to_id(t))
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(bundled._SRC / "tokenizer_config.json") as f:
        cfg = json.load(f)
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)


def tiny_mm_model_dir(path: str, seed: int = 0):
    """Saves the model, tokenizer, generation config and preprocessor config; returns the HF model too."""
    model = tiny_mm_hf_model(seed)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 5], "pad_token_id": 0}, f)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump({"do_convert_rgb": True, "do_normalize": False, "do_rescale": True, "do_resize": True,
                   "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                   "image_processor_type": "SiglipImageProcessor", "resample": 2,
                   "rescale_factor": 1 / 255, "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                   "feature_extractor_type": "Gemma3nAudioFeatureExtractor", "feature_size": 128,
                   "sampling_rate": 16000}, f)
    return model


# ---- media -------------------------------------------------------------------------------------------

def random_image(seed: int, size=(48, 40)):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8), mode="RGB")


def image_bytes(img, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def random_audio(seed: int, seconds: float = 1.0, sr: int = 16000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


def wav_bytes(wave: np.ndarray, sr: int = 16000, fmt: str = "WAV") -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, wave, sr, format=fmt)
    return buf.getvalue()


def copy_dir(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst
