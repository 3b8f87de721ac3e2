"""Random Gemma 3n executors built without transformers (the GPU check runs where only torch and
Triton are installed): tiny-10L and tiny-E2B-depth from ``shared/docs/gemma3n_tiny.py``, and the real
E2B sizes for speed figures. Weights are re-randomized like ``tiny.randomize`` (norms 1 +- 0.1,
``correct_output_scale`` ~ N(0, 0.5^2), matrices N(0, fan_in^-1/2)) so every path contributes."""

from __future__ import annotations

import torch

from yoco_rs.executor.cpu_linear import weight_shape
from yoco_rs.executor.executor import Executor
from yoco_rs.models.gemma3n.config import Gemma3nTextArgs
from yoco_rs.models.gemma3n.model import Gemma3nModel

TINY_10L = dict(
    vocab_size=512, vocab_size_per_layer_input=384, hidden_size=128, hidden_size_per_layer_input=32,
    intermediate_size=256, num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2, num_kv_shared_layers=5, sliding_window=16,
    activation_sparsity_pattern=[0.95] * 3 + [0.0] * 7, laurel_rank=16, altup_num_inputs=4, altup_active_idx=0,
    max_position_embeddings=1024, final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1,
)
TINY_E2B_DEPTH = dict(TINY_10L, num_hidden_layers=30, layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 6,
                      num_kv_shared_layers=10, activation_sparsity_pattern=[0.95] * 10 + [0.0] * 20)
E2B = dict(
    vocab_size=262_400, vocab_size_per_layer_input=262_144, hidden_size=2048, hidden_size_per_layer_input=256,
    intermediate_size=[8192] * 30, num_hidden_layers=30, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 6, num_kv_shared_layers=10, sliding_window=512,
    activation_sparsity_pattern=[0.95] * 10 + [0.0] * 20, laurel_rank=64, altup_num_inputs=4, altup_active_idx=0,
    max_position_embeddings=32_768, final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1,
)


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int = 0, qk_norm_scale: float = 1.0) -> torch.nn.Module:
    """``qk_norm_scale`` < 1 tames a real-size model: with unit q/k norms and Gemma 3n's attention scale 1.0
    the scores have std ~16 at head_dim 256, the softmax is near one-hot and one ulp anywhere changes the
    tokens (``e2b_checkpoint.QK_NORM_SCALE`` has the figures)."""
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, p in model.named_parameters():
        parts = name.split(".")
        if name.endswith("norm.weight") or (len(parts) > 1 and "norm" in parts[-2]):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, device=dev))
            if qk_norm_scale != 1.0 and len(parts) > 1 and parts[-2] in ("q_norm", "k_norm"):
                p.mul_(qk_norm_scale)
        elif "correct_output_scale" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=g, device=dev))
        else:
            std = weight_shape(p)[-1] ** -0.5 if p.dim() > 1 else 0.5  # fan-in (CPU panels: not shape[-1])
            p.copy_(torch.randn(p.shape, generator=g, device=dev) * std)
    return model


def random_executor(cfg: dict, *, dtype=torch.float32, device="cpu", seed: int = 0, fast_prefill: bool = True,
                    backend=None, qk_norm_scale: float = 1.0) -> Executor:
    args = Gemma3nTextArgs.from_dict(dict(cfg))
    model = randomize(Gemma3nModel(args, dtype=dtype, device=device), seed, qk_norm_scale)
    return Executor(model, kv_sharing_fast_prefill=fast_prefill, attn_backend=backend)
