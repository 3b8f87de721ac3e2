"""Tiny random Gemma 3n text models for tests (HF transformers 5.24.0 classes), from
``shared/docs/gemma3n_tiny.py``. Every test must ``randomize()``: HF's default init zeroes the
per-layer-embedding branch (``correct_output_scale = 0``) and hides bugs there."""

from __future__ import annotations

import torch

# The real E2B layer structure: 30 layers, producers 18 (sliding) / 19 (full), consumers 20..29,
# sparse MLP on layers 0..9. Use as tiny_config(**E2B_DEPTH).
E2B_DEPTH = dict(
    num_hidden_layers=30,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 6,
    num_kv_shared_layers=10,
    activation_sparsity_pattern=[0.95] * 10 + [0.0] * 20,
)


def tiny_config(attn_impl: str = "eager", **over):
    """tiny-10L by default: layers 5..9 share KV; producers 3 (sliding) and 4 (full); window 16."""
    from transformers import Gemma3nTextConfig

    kw = dict(
        vocab_size=512, vocab_size_per_layer_input=384,
        hidden_size=128, hidden_size_per_layer_input=32,
        intermediate_size=256, num_hidden_layers=10,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
        num_kv_shared_layers=5,
        sliding_window=16,
        activation_sparsity_pattern=[0.95] * 3 + [0.0] * 7,
        laurel_rank=16, altup_num_inputs=4, altup_active_idx=0,
        max_position_embeddings=1024, final_logit_softcapping=30.0,
        pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )
    kw.update(over)
    cfg = Gemma3nTextConfig(**kw)
    cfg._attn_implementation = attn_impl
    return cfg


def randomize(model, seed: int = 0, std: float = 0.5):
    """Re-randomize every parameter so every path contributes (norms 1 +- 0.1, weights N(0, fan_in^-1/2),
    correct_output_scale ~ N(0, 0.5^2))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "norm" in name.split(".")[-2]:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "correct_output_scale" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) * (std if p.dim() == 1 else fan_in ** -0.5))
    return model


def tiny_hf_model(seed: int = 0, attn_impl: str = "eager", **over):
    """A randomized ``Gemma3nForCausalLM`` in eval mode, float32."""
    from transformers import Gemma3nForCausalLM

    torch.manual_seed(seed)
    return randomize(Gemma3nForCausalLM(tiny_config(attn_impl, **over)).eval(), seed=seed)
