//! Synthetic K, V and queries for the plan oracle: pseudo-random vectors that are a pure function of
//! (the request's namespace and tokens up to the position, the position, the layer).
//!
//! Depending on the whole prefix matters: a real model's K/V at position p depends on every token up
//! to p, so a prefix hit that shares KV across *different* prefixes (or namespaces) must show up as a
//! mismatch, and it does, because the two prefixes hash apart.

use crate::attention::Heads;
use crate::rng::{chain, Rng};

/// The generator of synthetic K, V and queries (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Synth {
    /// Head layout of what it generates.
    pub heads: Heads,
    /// Mixed into every vector, so two oracles with different seeds see different values.
    pub seed: u64,
}

const TAG_K: u64 = 1;
const TAG_V: u64 = 2;
const TAG_Q: u64 = 3;

impl Synth {
    fn fill(
        &self,
        prefix_hash: u64,
        pos: usize,
        layer: usize,
        tag: u64,
        out: &mut Vec<f32>,
        n: usize,
    ) {
        let mut rng = Rng::new(chain(
            chain(
                chain(chain(self.seed, prefix_hash), pos as u64),
                layer as u64,
            ),
            tag,
        ));
        out.extend((0..n).map(|_| rng.sym_f32()));
    }

    /// Appends K and V (`[kv_heads * head_dim]` each) of the token at `pos` in `layer`.
    pub fn kv(
        &self,
        prefix_hash: u64,
        pos: usize,
        layer: usize,
        k: &mut Vec<f32>,
        v: &mut Vec<f32>,
    ) {
        self.fill(prefix_hash, pos, layer, TAG_K, k, self.heads.kv_len());
        self.fill(prefix_hash, pos, layer, TAG_V, v, self.heads.kv_len());
    }

    /// The query (`[num_heads * head_dim]`) of the token at `pos` in `layer`.
    pub fn q(&self, prefix_hash: u64, pos: usize, layer: usize) -> Vec<f32> {
        let mut q = Vec::with_capacity(self.heads.q_len());
        self.fill(prefix_hash, pos, layer, TAG_Q, &mut q, self.heads.q_len());
        q
    }

    /// What padding tokens write (block 0): never read by a correct plan.
    pub fn junk(&self, tok: usize, layer: usize, k: &mut Vec<f32>, v: &mut Vec<f32>) {
        self.fill(u64::MAX, tok, layer, TAG_K, k, self.heads.kv_len());
        self.fill(u64::MAX, tok, layer, TAG_V, v, self.heads.kv_len());
    }
}
