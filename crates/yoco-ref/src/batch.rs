//! Attention for a whole varlen batch, the shape kernels have: queries `[N, num_heads, head_dim]`
//! split into rows by `query_start_loc`, each bottom-right aligned against its row's `seq_lens`
//! entry, keys read from paged memory through block tables, or from per-row contiguous K/V.

use candle_core::{Device, Tensor};

use crate::attention::{attend, bottom_right, visible, Heads};
use crate::bail;
use crate::error::Result;
use crate::paged::PagedKv;

/// Varlen batch metadata (what a `StepPlan` carries for one attention call).
#[derive(Debug, Clone, Copy)]
pub struct Varlen<'a> {
    /// `[R + 1]`
    pub query_start_loc: &'a [i32],
    /// `[R]`
    pub seq_lens: &'a [i32],
    /// Multiplier of `q . k` before the softmax (Gemma 3n: 1.0, its q/k are normalised per head).
    pub scale: f32,
    /// HF convention (`q - W < k <= q`); `None` for full causal.
    pub window: Option<u32>,
}

fn rows(v: &Varlen, n: usize) -> Result<Vec<(std::ops::Range<usize>, usize)>> {
    let r = v.seq_lens.len();
    if v.query_start_loc.len() != r + 1 {
        bail!(
            "query_start_loc has {} entries for {r} rows",
            v.query_start_loc.len()
        );
    }
    (0..r)
        .map(|i| {
            let (a, b) = (v.query_start_loc[i], v.query_start_loc[i + 1]);
            if a < 0 || b < a || b as usize > n {
                bail!("query_start_loc[{i}..={}] = {a}..{b} outside 0..{n}", i + 1);
            }
            if v.seq_lens[i] < b - a {
                bail!("row {i}: seq_len {} < {} queries", v.seq_lens[i], b - a);
            }
            Ok((a as usize..b as usize, v.seq_lens[i] as usize))
        })
        .collect()
}

/// Paged attention: `q` `[N, H, D]`; row `r`'s keys are layer `(group, slot)` of `kv` through
/// `block_tables[r]`. Rows of `q` outside every row (padding) are 0.
pub fn paged_attention(
    q: &Tensor,
    kv: &PagedKv,
    group: usize,
    slot: usize,
    block_tables: &[&[i32]],
    v: &Varlen,
) -> Result<Tensor> {
    let geo = kv.geometry();
    let (n, nh, d) = q.dims3()?;
    let h = Heads {
        num_heads: nh,
        kv_heads: geo.kv_heads,
        head_dim: d,
    };
    let qv: Vec<f32> = q.flatten_all()?.to_vec1()?;
    let mut out = vec![0f32; n * h.q_len()];
    let rows = rows(v, n)?;
    if block_tables.len() != rows.len() {
        bail!(
            "{} block-table rows for {} rows",
            block_tables.len(),
            rows.len()
        );
    }
    for ((toks, seq_len), table) in rows.into_iter().zip(block_tables) {
        if toks.is_empty() {
            continue;
        }
        let pos = bottom_right(toks.len(), seq_len).expect("checked");
        let lo = visible(pos.start, v.window).start;
        let (k, vv) = kv.gather_vecs(group, slot, table, lo, seq_len)?;
        for (t, p) in toks.zip(pos) {
            attend(
                h,
                &qv[t * h.q_len()..][..h.q_len()],
                &k,
                &vv,
                lo,
                p,
                v.window,
                v.scale,
                &mut out[t * h.q_len()..][..h.q_len()],
            );
        }
    }
    Ok(Tensor::from_vec(out, (n, nh, d), &Device::Cpu)?)
}

/// The same attention from each row's contiguous K/V (`[seq_len, kv_heads, head_dim]` each),
/// computed row by row, independently of any paging.
pub fn contiguous_attention(
    q: &Tensor,
    keys: &[Tensor],
    values: &[Tensor],
    v: &Varlen,
) -> Result<Tensor> {
    let (n, nh, d) = q.dims3()?;
    let qv: Vec<f32> = q.flatten_all()?.to_vec1()?;
    let rows = rows(v, n)?;
    if keys.len() != rows.len() || values.len() != rows.len() {
        bail!(
            "{} / {} K/V rows for {} rows",
            keys.len(),
            values.len(),
            rows.len()
        );
    }
    let mut out = vec![0f32; n * nh * d];
    for (r, (toks, seq_len)) in rows.into_iter().enumerate() {
        let (kn, kvh, kd) = keys[r].dims3()?;
        if kn != seq_len || kd != d || values[r].dims() != keys[r].dims() {
            bail!(
                "row {r}: K {:?} / V {:?}, want [{seq_len}, kv_heads, {d}]",
                keys[r].dims(),
                values[r].dims()
            );
        }
        let h = Heads {
            num_heads: nh,
            kv_heads: kvh,
            head_dim: d,
        };
        let (k, vv): (Vec<f32>, Vec<f32>) = (
            keys[r].flatten_all()?.to_vec1()?,
            values[r].flatten_all()?.to_vec1()?,
        );
        let Some(pos) = bottom_right(toks.len(), seq_len) else {
            continue;
        };
        for (t, p) in toks.zip(pos) {
            let vis = visible(p, v.window);
            let kvl = h.kv_len();
            attend(
                h,
                &qv[t * h.q_len()..][..h.q_len()],
                &k[vis.start * kvl..vis.end * kvl],
                &vv[vis.start * kvl..vis.end * kvl],
                vis.start,
                p,
                v.window,
                v.scale,
                &mut out[t * h.q_len()..][..h.q_len()],
            );
        }
    }
    Ok(Tensor::from_vec(out, (n, nh, d), &Device::Cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paged::{Fill, KvGeometry};

    #[test]
    fn paged_equals_contiguous_and_padding_rows_stay_zero() {
        let geo = KvGeometry {
            block_size: 2,
            kv_heads: 1,
            head_dim: 2,
        };
        let mut kv = PagedKv::new(geo, &[6], &[1], Fill::Nan).unwrap();
        // One row of 3 tokens in blocks 4, 1.
        let k: Vec<f32> = vec![0.1, 0.2, 0.3, -0.4, 0.5, 0.6];
        let v: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        kv.write_kv_slices(0, 0, &[8, 9, 2], &k, &v).unwrap();
        let q = Tensor::from_vec(
            vec![1.0f32, -1.0, 0.5, 0.5, 2.0, 0.0, 9.0, 9.0],
            (4, 1, 2),
            &Device::Cpu,
        )
        .unwrap();
        let vl = Varlen {
            query_start_loc: &[0, 2],
            seq_lens: &[3],
            scale: 1.0,
            window: Some(2),
        };
        let paged = paged_attention(&q, &kv, 0, 0, &[&[4, 1]], &vl).unwrap();
        let kt = Tensor::from_vec(k, (3, 1, 2), &Device::Cpu).unwrap();
        let vt = Tensor::from_vec(v, (3, 1, 2), &Device::Cpu).unwrap();
        let cont = contiguous_attention(&q, &[kt], &[vt], &vl).unwrap();
        let (a, b): (Vec<f32>, Vec<f32>) = (
            paged.flatten_all().unwrap().to_vec1().unwrap(),
            cont.flatten_all().unwrap().to_vec1().unwrap(),
        );
        assert_eq!(a, b);
        assert_eq!(&a[4..], &[0.0; 4], "rows outside every row are padding");
        // Queries 0 and 1 sit at positions 1 and 2 (bottom-right); with W = 2, position 2 sees keys 1..=2.
        assert!(a[..4].iter().all(|x| x.is_finite()));
        let bad = Varlen {
            query_start_loc: &[0, 5],
            ..vl
        };
        assert!(paged_attention(&q, &kv, 0, 0, &[&[4, 1]], &bad).is_err());
    }
}
