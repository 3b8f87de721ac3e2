//! The register-tile kernel for row-major weights (torch's contiguous `[N, K]`), any number of rows.
//!
//! Per chunk of rows (`x` rows kept cache-sized) and per tile of NR output columns: the tile's rows of `w`
//! (one contiguous run) are transposed over all of K into an f32 panel (`panel[k][j]`), then each
//! register tile of `MR` rows x NR columns runs over it one block of K at a time, adding the block's
//! chains into an f32 accumulator tile, written out after the last block. Every output gets the
//! chain-per-block order of the crate doc whatever tile, chunk or thread computes it.

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

use crate::job::Job;
use crate::pack::{pack_row_major, Elem};

/// Register tile `(MR rows, NV vectors of 8 columns)` for `m` rows: the shape with the fewest estimated
/// cycles per output column (the last row tile takes the remainder). A tile's `k` step costs at least
/// its FMAs (2 per cycle), its loads (3 per cycle) and the FMA latency (5 cycles: the chains are
/// sequential in k, so fewer than 10 accumulators leave the FMA units waiting). Only shapes whose
/// accumulators and operands fit the 16 vector registers (6 x 2, 1 x 4: larger ones spill and run at half
/// speed, measured).
pub(crate) fn tile(m: usize) -> (usize, usize) {
    let step = |mr: usize, nv: usize| {
        ((mr * nv) as f64 / 2.0)
            .max((mr + nv) as f64 / 3.0)
            .max(5.0)
    };
    let cost = |mr: usize, nv: usize| {
        let (full, rest) = (m / mr, m % mr);
        (full as f64 * step(mr, nv) + if rest > 0 { step(rest, nv) } else { 0.0 }) / (8 * nv) as f64
    };
    [(6, 2), (1, 4)]
        .into_iter()
        .filter(|&(mr, _)| mr <= m.max(1))
        .min_by(|a, b| cost(a.0, a.1).total_cmp(&cost(b.0, b.1)))
        .unwrap_or((1, 4))
}

/// Rows of `x` per chunk: about 1 MiB of f32 (cache-resident while every column tile reads it).
fn chunk_rows(m: usize, k: usize, mr: usize) -> usize {
    let rows = ((1usize << 18) / k.max(1)).max(mr);
    (rows / mr * mr).min(m)
}

/// Columns `lo..hi` of `y` (`lo` a multiple of the tile width) for row-major `w`.
///
/// # Safety
/// `job` describes checked buffers, `w` is its weight pointer, AVX2 and FMA are available, and no other
/// thread writes these columns of `y`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn columns<T: Elem>(job: &Job, w: *const T, lo: usize, hi: usize) {
    debug_assert!(!job.k_major);
    let (mr, nv) = tile(job.m);
    let nr = 8 * nv;
    let (m, k) = (job.m, job.k);
    let kc = job.kc.min(k.max(1));
    let mc = chunk_rows(m, k, mr);
    let mut panel = vec![0f32; k * nr];
    let mut acc = vec![0f32; mc * nr];
    let mut i0 = 0;
    while i0 < m {
        let rows = mc.min(m - i0);
        let mut j0 = lo;
        while j0 < hi {
            let cols = nr.min(hi - j0);
            pack_row_major(
                w.add(j0 * job.ldw),
                job.ldw,
                cols,
                k,
                nv,
                panel.as_mut_ptr(),
            );
            if k == 0 {
                acc[..rows * nr].fill(0.0);
            }
            let mut r0 = 0;
            while r0 < rows {
                let tr = mr.min(rows - r0);
                let mut k0 = 0;
                while k0 < k {
                    let kb = kc.min(k - k0);
                    let x = job.x.add((i0 + r0) * job.ldx + k0);
                    let p = panel.as_ptr().add(k0 * nr);
                    dispatch(
                        tr,
                        nv,
                        kb,
                        x,
                        job.ldx,
                        p,
                        nr,
                        acc.as_mut_ptr().add(r0 * nr),
                        nr,
                        k0 == 0,
                    );
                    k0 += kb;
                }
                r0 += tr;
            }
            for r in 0..rows {
                job.write(i0 + r, j0, &acc[r * nr..r * nr + cols]);
            }
            j0 += cols;
        }
        i0 += rows;
    }
}

/// `tr x (8 nv)` tile over a `kb`-term block: `acc (+)= x[0..tr] · panel` (stored on the first block);
/// panel rows `ldp` apart, accumulator rows `ldt` apart.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn dispatch(
    tr: usize,
    nv: usize,
    kb: usize,
    x: *const f32,
    ldx: usize,
    p: *const f32,
    ldp: usize,
    acc: *mut f32,
    ldt: usize,
    first: bool,
) {
    macro_rules! go {
        ($($mr:literal, $nv:literal);*) => {
            match (tr, nv) {
                $(($mr, $nv) => micro::<$mr, $nv>(kb, x, ldx, p, ldp, acc, ldt, first),)*
                _ => unreachable!("tile {tr} x {nv}"),
            }
        };
    }
    go!(1, 4; 6, 2; 5, 2; 4, 2; 3, 2; 2, 2; 1, 2)
}

#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const MR: usize, const NV: usize>(
    kb: usize,
    x: *const f32,
    ldx: usize,
    p: *const f32,
    ldp: usize,
    acc: *mut f32,
    ldt: usize,
    first: bool,
) {
    let mut c = [[_mm256_setzero_ps(); NV]; MR];
    let mut pk = p;
    for kk in 0..kb {
        if MR == 1 {
            let a = _mm256_broadcast_ss(&*x.add(kk));
            for v in 0..NV {
                c[0][v] = _mm256_fmadd_ps(a, _mm256_loadu_ps(pk.add(8 * v)), c[0][v]);
            }
        } else {
            let mut b = [_mm256_setzero_ps(); NV];
            for v in 0..NV {
                b[v] = _mm256_loadu_ps(pk.add(8 * v));
            }
            for r in 0..MR {
                let a = _mm256_broadcast_ss(&*x.add(r * ldx + kk));
                for v in 0..NV {
                    c[r][v] = _mm256_fmadd_ps(a, b[v], c[r][v]);
                }
            }
        }
        pk = pk.add(ldp);
    }
    for r in 0..MR {
        for v in 0..NV {
            let dst = acc.add(r * ldt + 8 * v);
            let val = if first {
                c[r][v]
            } else {
                _mm256_add_ps(_mm256_loadu_ps(dst), c[r][v])
            };
            _mm256_storeu_ps(dst, val);
        }
    }
}
