//! The reference model of paged KV memory: per KV group and producing layer, a K and a V tensor
//! `[num_blocks, block_size, kv_heads, head_dim]` (candle, f32, CPU), addressed exactly as the
//! executor addresses its tensors: `slot = block * block_size + offset`.
//!
//! Kept as `[num_blocks * block_size, kv_heads * head_dim]` internally (the same bytes), so a slot is
//! a row: writes are one `scatter_set` over rows, gathers one `index_select`, copies a row range.

use candle_core::{DType, Device, Tensor};
use yoco_core::kv::CopyOp;

use crate::error::{Error, Result};
use crate::rng::Rng;

/// What never-written slots hold. `Nan` makes any read of a slot that no token wrote poison the
/// attention output, so the oracle cannot pass by reading zeros that happen to be "right".
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fill {
    /// NaN everywhere: any read of an unwritten slot shows (the oracle and executor use this).
    Nan,
    /// Zeros (tests that need finite garbage).
    Zero,
    /// Uniform in [-1, 1) from this seed (golden files: kernels should see realistic garbage).
    Random(u64),
}

/// Geometry shared by every group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Token slots per block.
    pub block_size: usize,
    /// K/V heads per token.
    pub kv_heads: usize,
    /// Floats per head.
    pub head_dim: usize,
}

impl KvGeometry {
    /// Floats per token per layer per K or V.
    pub fn row(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// K and V of one producing layer.
#[derive(Debug, Clone)]
struct LayerKv {
    k: Tensor,
    v: Tensor,
}

/// Paged K/V for every producing layer, grouped like the executor's tensors.
#[derive(Debug, Clone)]
pub struct PagedKv {
    geo: KvGeometry,
    num_blocks: Vec<usize>,
    /// `[group][slot]`
    layers: Vec<Vec<LayerKv>>,
}

impl PagedKv {
    /// `layers_per_group[g]` producing layers in group g, `num_blocks[g]` blocks each (block 0 included).
    pub fn new(
        geo: KvGeometry,
        num_blocks: &[usize],
        layers_per_group: &[usize],
        fill: Fill,
    ) -> Result<Self> {
        if num_blocks.len() != layers_per_group.len() {
            return Err(Error::msg(format!(
                "num_blocks has {} groups but layers_per_group has {}",
                num_blocks.len(),
                layers_per_group.len()
            )));
        }
        let mut rng = Rng::new(match fill {
            Fill::Random(s) => s,
            _ => 0,
        });
        let mut make = |n: usize| -> Result<Tensor> {
            let len = n * geo.block_size * geo.row();
            let data: Vec<f32> = match fill {
                Fill::Nan => vec![f32::NAN; len],
                Fill::Zero => vec![0.0; len],
                Fill::Random(_) => (0..len).map(|_| rng.sym_f32()).collect(),
            };
            Ok(Tensor::from_vec(
                data,
                (n * geo.block_size, geo.row()),
                &Device::Cpu,
            )?)
        };
        let mut layers = Vec::new();
        for (&n, &l) in num_blocks.iter().zip(layers_per_group) {
            let mut group = Vec::new();
            for _ in 0..l {
                group.push(LayerKv {
                    k: make(n)?,
                    v: make(n)?,
                });
            }
            layers.push(group);
        }
        Ok(PagedKv {
            geo,
            num_blocks: num_blocks.to_vec(),
            layers,
        })
    }

    /// The geometry every group shares.
    pub fn geometry(&self) -> KvGeometry {
        self.geo
    }

    /// KV groups (pools).
    pub fn num_groups(&self) -> usize {
        self.layers.len()
    }

    /// Blocks in `group`'s pool, block 0 included.
    pub fn num_blocks(&self, group: usize) -> usize {
        self.num_blocks[group]
    }

    fn num_slots(&self, group: usize) -> usize {
        self.num_blocks[group] * self.geo.block_size
    }

    fn layer(&self, group: usize, slot: usize) -> Result<&LayerKv> {
        self.layers
            .get(group)
            .and_then(|g| g.get(slot))
            .ok_or_else(|| Error::msg(format!("no producing layer slot {slot} in group {group}")))
    }

    /// K and V of one layer as `[num_blocks, block_size, kv_heads, head_dim]` (views of the memory).
    pub fn tensors(&self, group: usize, slot: usize) -> Result<(Tensor, Tensor)> {
        let l = self.layer(group, slot)?;
        let shape = (
            self.num_blocks[group],
            self.geo.block_size,
            self.geo.kv_heads,
            self.geo.head_dim,
        );
        Ok((l.k.reshape(shape)?, l.v.reshape(shape)?))
    }

    /// Replaces one layer's memory (shapes as [`PagedKv::tensors`]); used to load golden inputs.
    pub fn set_tensors(&mut self, group: usize, slot: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let rows = (self.num_slots(group), self.geo.row());
        let l = self
            .layers
            .get_mut(group)
            .and_then(|g| g.get_mut(slot))
            .ok_or_else(|| {
                Error::msg(format!("no producing layer slot {slot} in group {group}"))
            })?;
        l.k = k.to_dtype(DType::F32)?.reshape(rows)?.copy()?;
        l.v = v.to_dtype(DType::F32)?.reshape(rows)?.copy()?;
        Ok(())
    }

    /// Writes `k`, `v` (`[T, kv_heads, head_dim]`, or flat `[T * kv_heads * head_dim]`) of T tokens
    /// into `slot_mapping[t]` of layer `(group, slot)`. Later tokens win on duplicate slots (the
    /// oracle rejects duplicates among real tokens before writing).
    pub fn write_kv(
        &mut self,
        group: usize,
        slot: usize,
        slot_mapping: &[i64],
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        let t = slot_mapping.len();
        let row = self.geo.row();
        let n = self.num_slots(group);
        let mut idx = Vec::with_capacity(t * row);
        for (i, &s) in slot_mapping.iter().enumerate() {
            if s < 0 || s as usize >= n {
                return Err(Error::msg(format!(
                    "slot_mapping[{i}] = {s} outside group {group}'s {n} slots ({} blocks of {})",
                    self.num_blocks[group], self.geo.block_size
                )));
            }
            idx.extend(std::iter::repeat(s as u32).take(row));
        }
        if t == 0 {
            return Ok(());
        }
        let idx = Tensor::from_vec(idx, (t, row), &Device::Cpu)?;
        let k = k.to_dtype(DType::F32)?.reshape((t, row))?.contiguous()?;
        let v = v.to_dtype(DType::F32)?.reshape((t, row))?.contiguous()?;
        let l = self.layer(group, slot)?;
        l.k.scatter_set(&idx, &k, 0)?;
        l.v.scatter_set(&idx, &v, 0)?;
        Ok(())
    }

    /// [`PagedKv::write_kv`] from flat f32 slices.
    pub fn write_kv_slices(
        &mut self,
        group: usize,
        slot: usize,
        slot_mapping: &[i64],
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        let want = slot_mapping.len() * self.geo.row();
        if k.len() != want || v.len() != want {
            return Err(Error::msg(format!(
                "write_kv: k/v hold {}/{} floats, want {want}",
                k.len(),
                v.len()
            )));
        }
        let kt = Tensor::from_slice(k, want, &Device::Cpu)?;
        let vt = Tensor::from_slice(v, want, &Device::Cpu)?;
        self.write_kv(group, slot, slot_mapping, &kt, &vt)
    }

    /// Applies copy ops in order: token slots `0..num_tokens` of `src` into `dst`, in every layer of
    /// the op's group, K and V.
    pub fn copy_blocks(&mut self, ops: &[CopyOp]) -> Result<()> {
        let bs = self.geo.block_size;
        for (i, op) in ops.iter().enumerate() {
            let g = op.group as usize;
            if g >= self.layers.len() {
                return Err(Error::msg(format!(
                    "kv_copies[{i}]: group {g} does not exist ({} groups)",
                    self.layers.len()
                )));
            }
            let nb = self.num_blocks[g];
            let (src, dst, n) = (op.src as usize, op.dst as usize, op.num_tokens as usize);
            if src >= nb || dst >= nb {
                return Err(Error::msg(format!(
                    "kv_copies[{i}]: block {src} -> {dst} outside group {g}'s {nb} blocks"
                )));
            }
            if n > bs {
                return Err(Error::msg(format!(
                    "kv_copies[{i}]: {n} tokens exceed the block size {bs}"
                )));
            }
            if n == 0 || src == dst {
                continue;
            }
            let rows = Tensor::from_vec(
                (0..n).map(|o| (src * bs + o) as u32).collect::<Vec<_>>(),
                n,
                &Device::Cpu,
            )?;
            for l in &self.layers[g] {
                for t in [&l.k, &l.v] {
                    let part = t.index_select(&rows, 0)?;
                    t.slice_set(&part, 0, dst * bs)?;
                }
            }
        }
        Ok(())
    }

    /// Slots of positions `start..end` of a sequence with this block table (`table[p / block_size]`).
    pub fn slots(&self, group: usize, table: &[i32], start: usize, end: usize) -> Result<Vec<u32>> {
        let bs = self.geo.block_size;
        let nb = self.num_blocks[group];
        (start..end)
            .map(|p| {
                let b = *table.get(p / bs).ok_or_else(|| {
                    Error::msg(format!("position {p} needs block-table entry {} but the row has {}", p / bs, table.len()))
                })?;
                if b < 0 || b as usize >= nb {
                    return Err(Error::msg(format!(
                        "block-table entry {} = {b} (position {p}) outside group {group}'s {nb} blocks",
                        p / bs
                    )));
                }
                Ok((b as usize * bs + p % bs) as u32)
            })
            .collect()
    }

    /// K and V of positions `start..end` of the sequence whose group-`group` block table is `table`,
    /// each `[end - start, kv_heads, head_dim]`.
    pub fn gather_range(
        &self,
        group: usize,
        slot: usize,
        table: &[i32],
        start: usize,
        end: usize,
    ) -> Result<(Tensor, Tensor)> {
        let slots = self.slots(group, table, start, end)?;
        let n = slots.len();
        let idx = Tensor::from_vec(slots, n, &Device::Cpu)?;
        let l = self.layer(group, slot)?;
        let shape = (n, self.geo.kv_heads, self.geo.head_dim);
        Ok((
            l.k.index_select(&idx, 0)?.reshape(shape)?,
            l.v.index_select(&idx, 0)?.reshape(shape)?,
        ))
    }

    /// K and V of a sequence's first `seq_len` tokens.
    pub fn gather(
        &self,
        group: usize,
        slot: usize,
        table: &[i32],
        seq_len: usize,
    ) -> Result<(Tensor, Tensor)> {
        self.gather_range(group, slot, table, 0, seq_len)
    }

    /// [`PagedKv::gather_range`] as flat f32 vectors.
    pub fn gather_vecs(
        &self,
        group: usize,
        slot: usize,
        table: &[i32],
        start: usize,
        end: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (k, v) = self.gather_range(group, slot, table, start, end)?;
        Ok((k.flatten_all()?.to_vec1()?, v.flatten_all()?.to_vec1()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> KvGeometry {
        KvGeometry {
            block_size: 4,
            kv_heads: 2,
            head_dim: 3,
        }
    }

    fn token(p: usize) -> Vec<f32> {
        (0..6).map(|i| (p * 10 + i) as f32).collect()
    }

    #[test]
    fn write_then_gather_follows_the_block_table() {
        let mut kv = PagedKv::new(geo(), &[8], &[2], Fill::Nan).unwrap();
        // A sequence of 6 tokens in blocks 5 then 2: slots 20..24 then 8..10.
        let table = [5, 2];
        let slots: Vec<i64> = (0..6)
            .map(|p| (table[p / 4] * 4 + (p % 4) as i32) as i64)
            .collect();
        let k: Vec<f32> = (0..6).flat_map(token).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        kv.write_kv_slices(0, 1, &slots, &k, &v).unwrap();
        let (gk, gv) = kv.gather_vecs(0, 1, &table, 0, 6).unwrap();
        assert_eq!(gk, k);
        assert_eq!(gv, v);
        let (gk, _) = kv.gather_vecs(0, 1, &table, 3, 5).unwrap();
        assert_eq!(gk, [token(3), token(4)].concat());
        // The other layer of the group was not touched.
        let (other, _) = kv.gather_vecs(0, 0, &table, 0, 1).unwrap();
        assert!(other.iter().all(|x| x.is_nan()));
        // Physical layout is [num_blocks, block_size, kv_heads, head_dim].
        let (kt, _) = kv.tensors(0, 1).unwrap();
        assert_eq!(kt.dims(), &[8, 4, 2, 3]);
        let b2: Vec<f32> = kt
            .get(2)
            .unwrap()
            .get(1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(b2, token(5));
    }

    #[test]
    fn copy_moves_exactly_the_first_n_slots_in_every_layer() {
        let mut kv = PagedKv::new(geo(), &[4, 4], &[2, 1], Fill::Zero).unwrap();
        for slot in 0..2 {
            let k: Vec<f32> = (0..4).flat_map(token).collect();
            kv.write_kv_slices(0, slot, &[4, 5, 6, 7], &k, &k).unwrap();
        }
        kv.copy_blocks(&[CopyOp {
            group: 0,
            src: 1,
            dst: 3,
            num_tokens: 3,
        }])
        .unwrap();
        for slot in 0..2 {
            let (gk, gv) = kv.gather_vecs(0, slot, &[3], 0, 4).unwrap();
            let want = [token(0), token(1), token(2), vec![0.0; 6]].concat();
            assert_eq!(gk, want);
            assert_eq!(gv, want);
        }
        // Group 1 untouched.
        let (g1, _) = kv.gather_vecs(1, 0, &[3], 0, 4).unwrap();
        assert!(g1.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn out_of_range_addresses_are_errors_that_name_the_value() {
        let mut kv = PagedKv::new(geo(), &[2], &[1], Fill::Zero).unwrap();
        let e = kv
            .write_kv_slices(0, 0, &[8], &[0.0; 6], &[0.0; 6])
            .unwrap_err()
            .to_string();
        assert!(e.contains("slot_mapping[0] = 8"), "{e}");
        let e = kv.gather_vecs(0, 0, &[1], 0, 5).unwrap_err().to_string();
        assert!(e.contains("position 4"), "{e}");
        let e = kv.gather_vecs(0, 0, &[7], 0, 1).unwrap_err().to_string();
        assert!(e.contains("= 7"), "{e}");
        let e = kv
            .copy_blocks(&[CopyOp {
                group: 0,
                src: 1,
                dst: 0,
                num_tokens: 5,
            }])
            .unwrap_err()
            .to_string();
        assert!(e.contains("exceed"), "{e}");
    }
}
