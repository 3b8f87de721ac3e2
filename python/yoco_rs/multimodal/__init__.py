"""Image and audio inputs: decoding and checks (``media``), preprocessing and placeholder expansion
(``processor``). The towers live with the model (``models/gemma3n/towers.py``), their cache and the
per-step merge with the executor (``executor/encoder_cache.py``, ``executor/mm_inputs.py``)."""

from yoco_rs.multimodal.media import MediaError

__all__ = ["MediaError"]
