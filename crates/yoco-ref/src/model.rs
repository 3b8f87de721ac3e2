//! A tiny deterministic decoder shaped like Gemma 3n where it matters for KV: per-layer sliding or
//! full attention, GQA, RoPE on q and k, a trailing run of layers that compute no K/V and read a
//! donor's (the cross-decoder). Random fixed weights from a seed. Everything per token is plain
//! f32 loops in a fixed order, so a token's hidden state is bit-identical however it is batched,
//! paged or selected; that is what makes "equal token streams" a fair demand.
//!
//! Not Gemma's numerics (no AltUp, PLE, LAuReL): the executor's HF comparison covers those. This
//! model exists to make wrong KV addressing change tokens.

use yoco_core::kv::LayerKind;

use crate::attention::{attend, visible, Heads};
use crate::error::{Error, Result};
use crate::layout::ModelLayout;
use crate::rng::Rng;

/// Shape and seed of a [`MockModel`]; [`MockConfig::tiny`] is the size every test uses.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Token ids `0..vocab`; larger ids are clamped to the last one when embedded.
    pub vocab: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Attention heads of every layer (GQA allowed; `head_dim` even for RoPE).
    pub heads: Heads,
    /// Width of each layer's GELU MLP.
    pub intermediate: usize,
    /// One entry per decoder layer: its attention type, or the donor whose KV it reads.
    pub layers: Vec<LayerKind>,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Attention score scale (Gemma 3n: 1.0, with q/k normalised per head).
    pub scale: f32,
    /// Seed of every weight: the same config always builds the same model.
    pub seed: u64,
}

impl MockConfig {
    /// 64-token vocabulary, hidden 32, 4 q heads / 2 kv heads of 8.
    pub fn tiny(layers: Vec<LayerKind>, seed: u64) -> Self {
        MockConfig {
            vocab: 64,
            hidden: 32,
            heads: Heads {
                num_heads: 4,
                kv_heads: 2,
                head_dim: 8,
            },
            intermediate: 64,
            layers,
            rope_theta: 10_000.0,
            scale: 1.0,
            seed,
        }
    }
}

#[derive(Debug, Clone)]
struct LayerWeights {
    norm1: Vec<f32>,
    wq: Vec<f32>,
    /// `None` on layers that share KV.
    wk: Option<Vec<f32>>,
    wv: Option<Vec<f32>>,
    wo: Vec<f32>,
    norm2: Vec<f32>,
    w_up: Vec<f32>,
    w_down: Vec<f32>,
}

/// The tiny Gemma-3n-shaped decoder (see the module docs): per-token pieces ([`MockModel::qkv`],
/// [`MockModel::finish`], [`MockModel::argmax`]) the executor assembles over paged memory, and the
/// cache-less reference run ([`MockModel::forward_contiguous`]) they must agree with.
#[derive(Debug, Clone)]
pub struct MockModel {
    /// The configuration it was built from.
    pub cfg: MockConfig,
    /// Where each layer's K/V lives (groups, donors, the cross-decoder's first layer).
    pub layout: ModelLayout,
    embed: Vec<f32>,
    /// Untied: with a tied head the residual copy of the current token's embedding dominates the
    /// logits and the model mostly repeats its input, blind to its context.
    lm_head: Vec<f32>,
    final_norm: Vec<f32>,
    layers: Vec<LayerWeights>,
}

/// What one layer computes for one token before attention.
pub struct Qkv {
    /// The query, `[num_heads * head_dim]`, normalised per head and rotated.
    pub q: Vec<f32>,
    /// K and V when the layer produces KV.
    pub kv: Option<(Vec<f32>, Vec<f32>)>,
}

/// Gains chosen so the attention output outweighs the token's own embedding in the residual: the
/// next token must depend on the context (see `examples/sensitivity.rs`).
const EMBED_GAIN: f32 = 1.0;
const WO_GAIN: f32 = 3.0;

fn matrix(rng: &mut Rng, rows: usize, cols: usize, gain: f32) -> Vec<f32> {
    let s = gain * (3.0 / cols as f32).sqrt();
    (0..rows * cols).map(|_| rng.sym_f32() * s).collect()
}

fn norm_weight(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 1.0 + 0.1 * rng.sym_f32()).collect()
}

/// `y = W x` with W `[out, in]` row-major, summed in index order.
fn linear(w: &[f32], x: &[f32]) -> Vec<f32> {
    let n = x.len();
    w.chunks_exact(n)
        .map(|row| {
            let mut s = 0f32;
            for i in 0..n {
                s += row[i] * x[i];
            }
            s
        })
        .collect()
}

fn rms_norm(x: &[f32], w: Option<&[f32]>) -> Vec<f32> {
    let mut ms = 0f32;
    for v in x {
        ms += v * v;
    }
    let r = (ms / x.len() as f32 + 1e-6).powf(-0.5);
    match w {
        Some(w) => x.iter().zip(w).map(|(v, w)| v * r * w).collect(),
        None => x.iter().map(|v| v * r).collect(),
    }
}

fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

impl MockModel {
    /// Draws every weight from `cfg.seed`; fails on a layer layout [`ModelLayout::new`] rejects or
    /// heads that GQA / RoPE cannot use.
    pub fn new(cfg: MockConfig) -> Result<Self> {
        let layout = ModelLayout::new(&cfg.layers).map_err(Error)?;
        let h = cfg.heads;
        if h.num_heads % h.kv_heads != 0 || h.head_dim % 2 != 0 {
            return Err(Error::msg(
                "num_heads must be a multiple of kv_heads and head_dim even",
            ));
        }
        let mut rng = Rng::new(cfg.seed);
        let embed = matrix(&mut rng, cfg.vocab, cfg.hidden, EMBED_GAIN);
        let layers = cfg
            .layers
            .iter()
            .map(|k| {
                let produces = !matches!(k, LayerKind::SharesKv { .. });
                LayerWeights {
                    norm1: norm_weight(&mut rng, cfg.hidden),
                    wq: matrix(&mut rng, h.q_len(), cfg.hidden, 1.0),
                    wk: produces.then(|| matrix(&mut rng, h.kv_len(), cfg.hidden, 1.0)),
                    wv: produces.then(|| matrix(&mut rng, h.kv_len(), cfg.hidden, 1.0)),
                    wo: matrix(&mut rng, cfg.hidden, h.q_len(), WO_GAIN),
                    norm2: norm_weight(&mut rng, cfg.hidden),
                    w_up: matrix(&mut rng, cfg.intermediate, cfg.hidden, 1.0),
                    w_down: matrix(&mut rng, cfg.hidden, cfg.intermediate, 1.0),
                }
            })
            .collect();
        let final_norm = norm_weight(&mut rng, cfg.hidden);
        let lm_head = matrix(&mut rng, cfg.vocab, cfg.hidden, 1.0);
        Ok(MockModel {
            cfg,
            layout,
            embed,
            lm_head,
            final_norm,
            layers,
        })
    }

    /// The input hidden state of token `tok` (ids past the vocabulary clamp to the last row).
    pub fn embed(&self, tok: u32) -> Vec<f32> {
        let t = (tok as usize).min(self.cfg.vocab - 1);
        self.embed[t * self.cfg.hidden..(t + 1) * self.cfg.hidden].to_vec()
    }

    /// NeoX RoPE over each head of `x` (`[heads * head_dim]`) at `pos`.
    fn rope(&self, x: &mut [f32], pos: i64) {
        let d = self.cfg.heads.head_dim;
        let half = d / 2;
        for head in x.chunks_exact_mut(d) {
            for i in 0..half {
                let inv = self.cfg.rope_theta.powf(-((2 * i) as f32) / d as f32);
                let (s, c) = (pos as f32 * inv).sin_cos();
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c - b * s;
                head[i + half] = b * c + a * s;
            }
        }
    }

    fn per_head_norm(&self, x: &[f32]) -> Vec<f32> {
        x.chunks_exact(self.cfg.heads.head_dim)
            .flat_map(|h| rms_norm(h, None))
            .collect()
    }

    /// Layer `layer`'s query (and K/V when it produces them) for a token with hidden `x` at `pos`.
    pub fn qkv(&self, layer: usize, x: &[f32], pos: i64) -> Qkv {
        let w = &self.layers[layer];
        let xn = rms_norm(x, Some(&w.norm1));
        let mut q = self.per_head_norm(&linear(&w.wq, &xn));
        self.rope(&mut q, pos);
        let kv = match (&w.wk, &w.wv) {
            (Some(wk), Some(wv)) => {
                let mut k = self.per_head_norm(&linear(wk, &xn));
                self.rope(&mut k, pos);
                Some((k, linear(wv, &xn)))
            }
            _ => None,
        };
        Qkv { q, kv }
    }

    /// The rest of layer `layer` given its attention output.
    pub fn finish(&self, layer: usize, x: &[f32], attn: &[f32]) -> Vec<f32> {
        let w = &self.layers[layer];
        let o = linear(&w.wo, attn);
        let x: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let up: Vec<f32> = linear(&w.w_up, &rms_norm(&x, Some(&w.norm2)))
            .into_iter()
            .map(gelu_tanh)
            .collect();
        let down = linear(&w.w_down, &up);
        x.iter().zip(&down).map(|(a, b)| a + b).collect()
    }

    /// Vocabulary logits of a final hidden state (final norm, then the untied head).
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        linear(&self.lm_head, &rms_norm(x, Some(&self.final_norm)))
    }

    /// Greedy choice: the first index of the largest logit.
    pub fn argmax(&self, x: &[f32]) -> u32 {
        let l = self.logits(x);
        let mut best = 0;
        for (i, &v) in l.iter().enumerate() {
            if v > l[best] {
                best = i;
            }
        }
        best as u32
    }

    /// Cache-less, unbatched forward over a whole sequence: final hidden state of every position.
    /// Contiguous K/V, every layer on every token, nothing paged or selected.
    pub fn forward_contiguous(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        let n = tokens.len();
        let h = self.cfg.heads;
        let nl = self.layout.num_layers();
        let mut x: Vec<Vec<f32>> = tokens.iter().map(|&t| self.embed(t)).collect();
        let mut ks: Vec<Vec<f32>> = vec![Vec::new(); nl];
        let mut vs: Vec<Vec<f32>> = vec![Vec::new(); nl];
        for layer in 0..nl {
            let qkv: Vec<Qkv> = (0..n).map(|p| self.qkv(layer, &x[p], p as i64)).collect();
            if self.layout.is_producer(layer) {
                for e in &qkv {
                    let (k, v) = e.kv.as_ref().unwrap();
                    ks[layer].extend_from_slice(k);
                    vs[layer].extend_from_slice(v);
                }
            }
            let at = self.layout.kv_of[layer];
            let src = self.layout.groups[at.group].layers[at.slot];
            let window = self.layout.window(layer);
            let mut out = vec![0f32; h.q_len()];
            for p in 0..n {
                let vis = visible(p, window);
                let kvl = h.kv_len();
                let (k, v) = (
                    &ks[src][vis.start * kvl..vis.end * kvl],
                    &vs[src][vis.start * kvl..vis.end * kvl],
                );
                attend(
                    h,
                    &qkv[p].q,
                    k,
                    v,
                    vis.start,
                    p,
                    window,
                    self.cfg.scale,
                    &mut out,
                );
                x[p] = self.finish(layer, &x[p], &out);
            }
        }
        x
    }

    /// Greedy continuation the slow way: a full cache-less forward per generated token.
    pub fn generate_uncached(&self, prompt: &[u32], stop: &StopRule) -> Vec<u32> {
        let mut tokens = prompt.to_vec();
        let mut out = Vec::new();
        loop {
            let x = self.forward_contiguous(&tokens);
            let t = self.argmax(x.last().unwrap());
            out.push(t);
            tokens.push(t);
            if stop.stops(&out, tokens.len()) {
                return out;
            }
        }
    }

    /// Checks a generated stream in one forward (teacher forcing): every output token must be the
    /// greedy choice after the tokens before it, and the stream must end exactly where `stop` ends
    /// it (unless it was cut short by an abort). Equivalent to comparing with
    /// [`MockModel::generate_uncached`], at the cost of one forward.
    pub fn verify_stream(
        &self,
        prompt: &[u32],
        output: &[u32],
        stop: &StopRule,
        aborted: bool,
    ) -> std::result::Result<(), String> {
        if output.is_empty() {
            return if aborted {
                Ok(())
            } else {
                Err("finished without a single output token".into())
            };
        }
        let mut tokens = prompt.to_vec();
        tokens.extend_from_slice(&output[..output.len() - 1]);
        let x = self.forward_contiguous(&tokens);
        for (i, &got) in output.iter().enumerate() {
            let want = self.argmax(&x[prompt.len() - 1 + i]);
            if got != want {
                return Err(format!("output token {i} is {got}, the cache-less greedy run gives {want} (prompt len {}, output so far {:?})", prompt.len(), &output[..i]));
            }
            let stops = stop.stops(&output[..=i], prompt.len() + i + 1);
            let last = i + 1 == output.len();
            if stops && !last {
                return Err(format!("the stream goes on after output token {i} ({got}), where the cache-less run stops"));
            }
            if last && !stops && !aborted {
                return Err(format!(
                    "the stream ends after {} tokens, where the cache-less run goes on",
                    output.len()
                ));
            }
        }
        Ok(())
    }
}

/// When greedy generation stops (vLLM's rules).
#[derive(Debug, Clone, Default)]
pub struct StopRule {
    /// Stop after this many output tokens.
    pub max_tokens: usize,
    /// EOS and stop tokens do not stop the stream before this many output tokens.
    pub min_tokens: usize,
    /// EOS ids: stop after sampling one (unless `ignore_eos`).
    pub eos: Vec<u32>,
    /// Stop-token ids: stop after sampling one (even with `ignore_eos`).
    pub stop_tokens: Vec<u32>,
    /// Generate past EOS ids.
    pub ignore_eos: bool,
    /// Stop when prompt + output reach this length.
    pub max_model_len: usize,
}

impl StopRule {
    /// Does the request stop after producing `output` (total length `total`)?
    pub fn stops(&self, output: &[u32], total: usize) -> bool {
        let last = *output.last().unwrap();
        let n = output.len();
        if n >= self.max_tokens || total >= self.max_model_len {
            return true;
        }
        if n < self.min_tokens {
            return false;
        }
        (!self.ignore_eos && self.eos.contains(&last)) || self.stop_tokens.contains(&last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> MockModel {
        let layers = vec![
            LayerKind::Sliding { window: 3 },
            LayerKind::Full,
            LayerKind::SharesKv { donor: 0 },
            LayerKind::SharesKv { donor: 1 },
        ];
        MockModel::new(MockConfig::tiny(layers, 1)).unwrap()
    }

    #[test]
    fn forward_is_causal_and_positions_matter() {
        let m = model();
        let a = m.forward_contiguous(&[5, 9, 13, 2, 7]);
        let b = m.forward_contiguous(&[5, 9, 13, 2, 40, 41]);
        for p in 0..4 {
            assert_eq!(a[p], b[p], "position {p} must not see later tokens");
        }
        assert_ne!(a[4], b[4]);
        // The same token at another position gives another state (RoPE, attention).
        let c = m.forward_contiguous(&[9, 5, 13, 2, 7]);
        assert_ne!(a[4], c[4]);
    }

    #[test]
    fn uncached_generation_passes_its_own_verification() {
        let m = model();
        let stop = StopRule {
            max_tokens: 6,
            max_model_len: 100,
            ..Default::default()
        };
        let prompt = [3, 1, 4, 1, 5, 9, 2, 6];
        let out = m.generate_uncached(&prompt, &stop);
        assert_eq!(out.len(), 6);
        m.verify_stream(&prompt, &out, &stop, false).unwrap();
        let mut bad = out.clone();
        bad[3] = (bad[3] + 1) % 64;
        assert!(m
            .verify_stream(&prompt, &bad, &stop, false)
            .unwrap_err()
            .contains("output token 3"));
        assert!(m
            .verify_stream(&prompt, &out[..4], &stop, false)
            .unwrap_err()
            .contains("goes on"));
        m.verify_stream(&prompt, &out[..4], &stop, true).unwrap();
    }
}
