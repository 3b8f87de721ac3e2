"""Encoder cost at the real E2B tower shapes on the CPU (random weights, float32): timm's
``mobilenetv5_300m_enc`` on one 768 x 768 image (256 soft tokens), transformers' ``Gemma3nAudioEncoder``
with E2B's audio config on clips of ``--seconds`` (188 soft tokens per 30 s window), each followed by its
embedder into E2B's 2048-wide text space, exactly as ``MultimodalTowers`` runs them. Medians of
``--reps`` runs after one warm-up; the two towers are built one after the other (peak RSS ~3 GB).

Run: ``OMP_NUM_THREADS=2 .venv/bin/python benches/mm_encoders_e2b.py``
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time

import numpy as np
import torch


def e2b_config() -> dict:
    from transformers import Gemma3nConfig

    cfg = Gemma3nConfig()  # transformers' defaults are E2B/E4B's towers; the text config does not matter here
    return cfg.to_dict()


def timed(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, nargs="+", default=[5.0, 30.0])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModel, Gemma3nConfig
    from transformers.models.gemma3n.feature_extraction_gemma3n import Gemma3nAudioFeatureExtractor
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nMultimodalEmbedder

    cfg = Gemma3nConfig.from_dict(e2b_config())
    with torch.inference_mode():
        vt = AutoModel.from_config(cfg.vision_config).eval()
        ev = Gemma3nMultimodalEmbedder(cfg.vision_config, cfg.text_config).eval()
        n_v = sum(p.numel() for p in vt.parameters())
        px = torch.rand(1, 3, 768, 768)

        def image():
            out = vt(pixel_values=px, do_pooling=False, return_dict=True).last_hidden_state
            soft = out.reshape(1, 2048, -1).permute(0, 2, 1) * 2048 ** 0.5
            return ev(inputs_embeds=soft)

        t_img = timed(image, a.reps)
        tokens = image().shape[1]
        print(f"vision tower mobilenetv5_300m_enc ({n_v / 1e6:.0f}M params, fp32, {a.threads} threads): "
              f"{t_img * 1e3:.0f} ms per 768x768 image ({tokens} soft tokens)")
        del vt, ev
        gc.collect()

        at = AutoModel.from_config(cfg.audio_config).eval()
        ea = Gemma3nMultimodalEmbedder(cfg.audio_config, cfg.text_config).eval()
        n_a = sum(p.numel() for p in at.parameters())
        fe = Gemma3nAudioFeatureExtractor()
        rng = np.random.default_rng(0)
        for sec in a.seconds:
            wave = (0.1 * rng.standard_normal(int(sec * 16000))).astype(np.float32)
            f = fe(wave, return_tensors="pt")
            feats, mask = f["input_features"], f["input_features_mask"].bool()

            def audio():
                o = at(feats, ~mask, return_dict=True)
                return ea(inputs_embeds=o.last_hidden_state)

            t_feat = timed(lambda: fe(wave, return_tensors="pt"), a.reps)
            t_aud = timed(audio, a.reps)
            print(f"audio encoder ({n_a / 1e6:.0f}M params, fp32, {a.threads} threads), {sec:g} s clip: features "
                  f"{t_feat * 1e3:.0f} ms + encoder {t_aud * 1e3:.0f} ms = {(t_feat + t_aud) / sec * 1e3:.0f} ms per "
                  f"second of audio ({audio().shape[1]} tokens)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
