//! Where each layer's K/V lives: KV groups, slots inside a group, and the donor of shared layers.
//!
//! Derived here independently of `yoco_core::kv::kv_groups` (a test compares the two), because an
//! oracle that reused the core's grouping would inherit its bugs.

use yoco_core::kv::{AttnKind, LayerKind};

/// The attention type a layer's *own* mask uses. `SharesKv` layers take their donor's type (Gemma 3n:
/// a shared layer reuses the last producer of its own type, so the two coincide).
pub type LayerAttn = AttnKind;

/// A producing layer's place in the paged memory: group `group`, slice `slot` of that group's
/// `[num_layers_in_group, 2, num_blocks, block_size, kv_heads, head_dim]` tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvSlot {
    /// KV group (which tensor).
    pub group: usize,
    /// Index of the layer inside its group (which slice of the tensor).
    pub slot: usize,
}

/// One KV group as the reference sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefGroup {
    /// Attention type shared by the group's layers.
    pub kind: AttnKind,
    /// Producing layers, ascending; `layers[i]` is slot `i`.
    pub layers: Vec<usize>,
}

/// The KV layout of a model: groups, and for every layer where the K/V it attends to lives.
#[derive(Debug, Clone)]
pub struct ModelLayout {
    /// The layers it was derived from, one per decoder layer.
    pub layers: Vec<LayerKind>,
    /// KV groups in order of first appearance (group `g` is the executor's KV tensor `g`).
    pub groups: Vec<RefGroup>,
    /// Per layer: the slot it reads (its own for producers, its donor's for shared layers).
    pub kv_of: Vec<KvSlot>,
    /// Per layer: the mask it applies.
    pub attn: Vec<LayerAttn>,
    /// First layer of the cross-decoder: the trailing run of `SharesKv` layers (== N when none).
    pub first_cross: usize,
}

impl ModelLayout {
    /// Groups producing layers by attention type in order of first appearance and resolves donors.
    /// Rejects a shared layer whose donor is not an earlier producing layer.
    pub fn new(layers: &[LayerKind]) -> Result<Self, String> {
        let mut groups: Vec<RefGroup> = Vec::new();
        let mut kv_of = Vec::with_capacity(layers.len());
        let mut attn = Vec::with_capacity(layers.len());
        for (i, kind) in layers.iter().enumerate() {
            let own = match *kind {
                LayerKind::Full => AttnKind::Full,
                LayerKind::Sliding { window } => {
                    if window == 0 {
                        return Err(format!("layer {i}: sliding window must be >= 1"));
                    }
                    AttnKind::Sliding { window }
                }
                LayerKind::SharesKv { donor } => {
                    if donor >= i {
                        return Err(format!("layer {i}: donor {donor} is not an earlier layer"));
                    }
                    if matches!(layers[donor], LayerKind::SharesKv { .. }) {
                        return Err(format!("layer {i}: donor {donor} computes no K/V itself"));
                    }
                    kv_of.push(kv_of[donor]);
                    attn.push(attn[donor]);
                    continue;
                }
            };
            let g = match groups.iter().position(|g| g.kind == own) {
                Some(g) => g,
                None => {
                    groups.push(RefGroup {
                        kind: own,
                        layers: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            kv_of.push(KvSlot {
                group: g,
                slot: groups[g].layers.len(),
            });
            groups[g].layers.push(i);
            attn.push(own);
        }
        let mut first_cross = layers.len();
        while first_cross > 0 && matches!(layers[first_cross - 1], LayerKind::SharesKv { .. }) {
            first_cross -= 1;
        }
        Ok(ModelLayout {
            layers: layers.to_vec(),
            groups,
            kv_of,
            attn,
            first_cross,
        })
    }

    /// Decoder layers, producing and shared.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether `layer` computes and writes its own K/V (false for `SharesKv` layers).
    pub fn is_producer(&self, layer: usize) -> bool {
        !matches!(self.layers[layer], LayerKind::SharesKv { .. })
    }

    /// Sliding window of a layer's mask (`None`: full causal).
    pub fn window(&self, layer: usize) -> Option<u32> {
        match self.attn[layer] {
            AttnKind::Full => None,
            AttnKind::Sliding { window } => Some(window),
        }
    }
}

/// Gemma 3n's rule: the last `num_kv_shared_layers` layers compute no K/V and read the last producing
/// layer *of their own type* before the shared range. `sliding[i]` says whether layer i is sliding.
pub fn gemma3n_layers(
    sliding: &[bool],
    window: u32,
    num_kv_shared_layers: usize,
) -> Result<Vec<LayerKind>, String> {
    let n = sliding.len();
    if num_kv_shared_layers > n {
        return Err(format!(
            "num_kv_shared_layers {num_kv_shared_layers} > num layers {n}"
        ));
    }
    let first_shared = n - num_kv_shared_layers;
    (0..n)
        .map(|i| {
            let own = if sliding[i] { LayerKind::Sliding { window } } else { LayerKind::Full };
            if i < first_shared {
                return Ok(own);
            }
            (0..first_shared)
                .rev()
                .find(|&j| sliding[j] == sliding[i])
                .map(|donor| LayerKind::SharesKv { donor })
                .ok_or_else(|| format!("shared layer {i} has no producing layer of its type before layer {first_shared}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_pattern_resolves_donors_18_and_19() {
        let sliding: Vec<bool> = (0..30).map(|i| (i + 1) % 5 != 0).collect();
        let layers = gemma3n_layers(&sliding, 512, 10).unwrap();
        for i in 20..30 {
            let want = if sliding[i] { 18 } else { 19 };
            assert_eq!(layers[i], LayerKind::SharesKv { donor: want }, "layer {i}");
        }
        let l = ModelLayout::new(&layers).unwrap();
        assert_eq!(l.groups.len(), 2);
        assert_eq!(l.groups[0].layers.len(), 16);
        assert_eq!(l.groups[1].layers, vec![4, 9, 14, 19]);
        assert_eq!(l.kv_of[29], KvSlot { group: 1, slot: 3 });
        assert_eq!(l.kv_of[28], KvSlot { group: 0, slot: 15 });
        assert_eq!(l.first_cross, 20);
        assert_eq!(l.window(29), None);
        assert_eq!(l.window(28), Some(512));
    }

    #[test]
    fn shared_layer_without_a_producer_of_its_type_is_rejected() {
        let err = gemma3n_layers(&[true, true, false], 4, 1).unwrap_err();
        assert!(err.contains("no producing layer"), "{err}");
        assert!(ModelLayout::new(&[LayerKind::Full, LayerKind::SharesKv { donor: 1 }]).is_err());
        assert!(ModelLayout::new(&[
            LayerKind::Full,
            LayerKind::SharesKv { donor: 0 },
            LayerKind::SharesKv { donor: 1 }
        ])
        .is_err());
    }
}
