//! KV groups: which decoder layers own KV, and which share block tables.
//!
//! Producing layers (full or sliding attention) are grouped by attention type, in order of first
//! appearance; each group gets its own pool and its own block table per request. Layers that reuse
//! another layer's KV (`SharesKv`, Gemma 3n's trailing cross-decoder layers) own nothing: they are
//! listed as *readers* of their donor's group and cost no blocks.

use crate::error::{Error, Result};

/// How one decoder layer relates to the KV cache, as the model config describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Causal attention over the whole history; owns KV.
    Full,
    /// Sliding-window attention: key k visible from query q iff `q - window < k <= q`; owns KV.
    Sliding {
        /// Tokens a query sees, itself included (>= 1).
        window: u32,
    },
    /// Computes no K/V: attends to the KV of layer `donor` (an earlier producing layer).
    SharesKv {
        /// Index of the producing layer whose KV this layer reads.
        donor: usize,
    },
}

/// Attention type of a KV group: what decides which of a request's blocks the group must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnKind {
    /// Every block of the history stays in the table.
    Full,
    /// Blocks wholly before the window are released (their table entries become [`NULL_BLOCK`]).
    ///
    /// [`NULL_BLOCK`]: super::NULL_BLOCK
    Sliding {
        /// Tokens a query sees, itself included (>= 1); layers with different windows are
        /// different groups.
        window: u32,
    },
}

impl AttnKind {
    /// The sliding window, `None` for full attention.
    pub fn window(self) -> Option<u32> {
        match self {
            AttnKind::Full => None,
            AttnKind::Sliding { window } => Some(window),
        }
    }
}

/// One KV group: the producing layers of one attention type, which share block tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGroup {
    /// Attention type shared by every layer of the group (it decides what the tables keep).
    pub kind: AttnKind,
    /// Producing layers of this group, ascending. Layer `layers[i]` is slice `i` of the group's
    /// KV tensor on the executor side.
    pub layers: Vec<usize>,
    /// Shared layers that read this group's KV, with their donor: `(layer, donor)`.
    pub readers: Vec<(usize, usize)>,
}

/// Groups producing layers by attention type, in order of first appearance. Rejects a shared layer
/// whose donor is not an earlier producing layer, a zero sliding window, and a model without any
/// producing layer.
pub fn kv_groups(layers: &[LayerKind]) -> Result<Vec<KvGroup>> {
    let mut groups: Vec<KvGroup> = Vec::new();
    // group of each producing layer (None for shared layers)
    let mut group_of: Vec<Option<usize>> = Vec::with_capacity(layers.len());
    for (i, kind) in layers.iter().enumerate() {
        let attn = match *kind {
            LayerKind::Full => AttnKind::Full,
            LayerKind::Sliding { window } => {
                if window == 0 {
                    return Err(Error::Config(format!(
                        "layers[{i}]: sliding window must be >= 1 (got 0)"
                    )));
                }
                AttnKind::Sliding { window }
            }
            LayerKind::SharesKv { donor } => {
                let g = if donor < i { group_of[donor] } else { None };
                let Some(g) = g else {
                    return Err(Error::Config(format!(
                        "layers[{i}]: SharesKv donor {donor} must be an earlier producing layer \
                         (Full or Sliding, index < {i})"
                    )));
                };
                groups[g].readers.push((i, donor));
                group_of.push(None);
                continue;
            }
        };
        let g = match groups.iter().position(|grp| grp.kind == attn) {
            Some(g) => g,
            None => {
                groups.push(KvGroup {
                    kind: attn,
                    layers: Vec::new(),
                    readers: Vec::new(),
                });
                groups.len() - 1
            }
        };
        groups[g].layers.push(i);
        group_of.push(Some(g));
    }
    if groups.is_empty() {
        return Err(Error::Config(
            "layers: at least one Full or Sliding layer is needed to own KV".into(),
        ));
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use LayerKind::*;

    #[test]
    fn layers_group_by_attention_type_in_order_of_first_appearance() {
        let layers = [
            Sliding { window: 4 },
            Full,
            Sliding { window: 4 },
            Full,
            SharesKv { donor: 2 },
            SharesKv { donor: 3 },
        ];
        let g = kv_groups(&layers).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].kind, AttnKind::Sliding { window: 4 });
        assert_eq!(g[0].layers, vec![0, 2]);
        assert_eq!(g[0].readers, vec![(4, 2)]);
        assert_eq!(g[1].kind, AttnKind::Full);
        assert_eq!(g[1].layers, vec![1, 3]);
        assert_eq!(g[1].readers, vec![(5, 3)]);
    }

    #[test]
    fn different_windows_make_different_groups() {
        let g = kv_groups(&[Sliding { window: 4 }, Sliding { window: 8 }]).unwrap();
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn shared_layers_follow_vllm_kv_sharing_examples() {
        // test_kv_sharing: {2->0, 3->1} with one group [0,1] -> readers of that group.
        let g = kv_groups(&[Full, Full, SharesKv { donor: 0 }, SharesKv { donor: 1 }]).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].layers, vec![0, 1]);
        assert_eq!(g[0].readers, vec![(2, 0), (3, 1)]);
        // two groups [0], [1] -> [0 + reader 2], [1 + reader 3]
        let g = kv_groups(&[
            Full,
            Sliding { window: 8 },
            SharesKv { donor: 0 },
            SharesKv { donor: 1 },
        ])
        .unwrap();
        assert_eq!(g[0].readers, vec![(2, 0)]);
        assert_eq!(g[1].readers, vec![(3, 1)]);
    }

    #[test]
    fn donor_must_be_an_earlier_producing_layer() {
        let e = kv_groups(&[Full, SharesKv { donor: 2 }, Full]).unwrap_err();
        assert!(e.to_string().contains("layers[1]"), "{e}");
        let e = kv_groups(&[Full, SharesKv { donor: 0 }, SharesKv { donor: 1 }]).unwrap_err();
        assert!(e.to_string().contains("layers[2]"), "{e}");
        assert!(kv_groups(&[SharesKv { donor: 0 }]).is_err());
        assert!(kv_groups(&[]).is_err());
        assert!(kv_groups(&[Sliding { window: 0 }]).is_err());
    }
}
