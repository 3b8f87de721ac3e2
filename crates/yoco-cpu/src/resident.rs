//! The kernel for weights in panels (how the executor stores CPU weights) or K-major, any number of
//! rows: register tiles whose chains stay in registers over a whole `kc` block.
//!
//! Why: the previous streaming kernel (K-major only) advanced every output's chain a few `k` at a time
//! and stored it to a buffer in between; at 8 rows x 8192 columns those buffers are L2-sized and their
//! traffic, not the weights, set the speed (8 rows cost 1.9x / 2.7x one row for the same weight bytes).
//! Here a tile of `MR` rows x `8 NV` columns runs all `kb` terms of a block with its `MR x NV` chains in
//! registers, then adds them into a small block-sum buffer (in order: the block sums of the crate doc).
//!
//! That needs a tile's weights of one block close together: in panels (`[N/16][K][16]`) they are one
//! contiguous run, and a tile column (one panel, or a few side by side for 1-3 rows) is read top to
//! bottom, block after block: one sequential stream per panel, prefetched `AHEAD` terms down by the
//! first row tile; the other row tiles of the block find it in L1. K-major weights work too (same
//! order, same bits) but a tile's block is then `kb` lines `ldw` apart, which DRAM and the prefetchers
//! serve poorly (~2x slower at E2B's sizes, measured): only what the executor does not store in panels
//! (N not a multiple of 16) and tests take that path.
//!
//! The rows' `x` is copied once per call into rows whose stride is not a multiple of 4 KiB (K = 2048
//! puts every row's current line into the same L1 set, and 8 rows then evict each other).

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

use crate::job::Job;
use crate::pack::Elem;
use crate::zmm;

/// Rows per pass over the weights (their block sums are `MC x CHUNK` f32: 96 KiB, in L2).
const MC: usize = 96;
/// K-major: columns per chunk, about (the chunk's weights for one block, `kc x CHUNK`, stay in cache for
/// the chunk's row tiles: 192 KiB f32 at `kc` 192). Panels: one tile column per chunk.
const CHUNK: usize = 256;
/// How many `k` ahead the first row tile of a tile column prefetches its weights (4 KiB of an f32 panel:
/// one stream per panel is not enough for the hardware prefetcher alone to keep 8 rows fed; measured
/// at 32, 64 and 128, see `benches/RESULTS.md`).
const AHEAD: usize = 64;

/// The register tile for `m` rows: `NV` vectors of 8 columns, and the rows of each tile. Every shape
/// keeps at least 8 chains in flight where the rows allow (FMA latency 4 x 2 pipes) and at most 12
/// (with the weight vectors and a broadcast, about the 16 vector registers); `NV` is even, so that every
/// tile starts on a panel (tiles, chunks and the threads' column ranges are multiples of 16 columns).
pub(crate) fn plan(m: usize) -> (usize, Vec<usize>) {
    match m {
        0 => (2, vec![]),
        1 => (8, vec![1]),
        2 => (4, vec![2]),
        3 => (4, vec![3]),
        _ => {
            let t = m.div_ceil(6);
            (2, (0..t).map(|i| m / t + usize::from(i < m % t)).collect())
        }
    }
}

/// Columns `lo..hi` of `y`.
///
/// # Safety
/// `job` describes checked buffers with K-major or panel weights, `w` is its weight pointer, AVX2 and FMA are
/// available, and no other thread writes these columns of `y`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn columns<T: Elem>(job: &Job, w: *const T, lo: usize, hi: usize) {
    debug_assert!(job.k_major || job.panels);
    let mc = MC.min(job.m);
    let mut acc = vec![0f32; mc * CHUNK];
    // the rows' x `ldx` apart, `ldx` not a multiple of 4 KiB (see the module doc)
    let ldx = job.k.next_multiple_of(16) + 16;
    let mut xs = vec![0f32; mc * ldx];
    let mut i0 = 0;
    while i0 < job.m {
        let m = MC.min(job.m - i0);
        for r in 0..m {
            std::ptr::copy_nonoverlapping(
                job.x.add((i0 + r) * job.ldx),
                xs.as_mut_ptr().add(r * ldx),
                job.k,
            );
        }
        rows(job, w, &xs, ldx, m, i0, lo, hi, &mut acc);
        i0 += m;
    }
}

/// Rows `i0..i0 + m` (`m <= MC`, their x in `xs`, `ldx` apart), columns `lo..hi`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<T: Elem>(
    job: &Job,
    w: *const T,
    xs: &[f32],
    ldx: usize,
    m: usize,
    i0: usize,
    lo: usize,
    hi: usize,
    acc: &mut [f32],
) {
    // AVX-512 (panels, from `zmm::MIN_ROWS` rows): the same tiles at 16 columns a register (`zmm.rs`)
    let wide = job.wide && job.panels && m >= zmm::MIN_ROWS;
    let (nv, tiles) = if wide { zmm::plan(m) } else { plan(m) };
    let tw = if wide { 16 * nv } else { 8 * nv };
    // panels: one tile column at a time, read top to bottom (its panels are sequential streams);
    // K-major: a chunk of tile columns whose block stays in cache for the chunk's row tiles
    let chunk = if job.panels {
        tw
    } else {
        (CHUNK / tw).max(1) * tw
    };
    let (k, ldw) = (job.k, job.ldw);
    let (ks, ps) = if job.panels { (16, ldw) } else { (ldw, 16) };
    let kc = job.kc.min(k.max(1));
    let x0 = xs.as_ptr();
    let mut j0 = lo;
    while j0 < hi {
        let cols = chunk.min(hi - j0);
        // panels are whole vectors wide (padded at N's edge): compute them, write the real columns
        let width_all = if wide {
            cols.next_multiple_of(16)
        } else if job.panels {
            cols.next_multiple_of(8)
        } else {
            cols
        };
        if k == 0 {
            acc[..m * chunk].fill(0.0);
        }
        let mut k0 = 0;
        while k0 < k {
            let kb = kc.min(k - k0);
            let mut c0 = 0;
            while c0 < width_all {
                let width = tw.min(width_all - c0);
                let wt = job.at(w, j0 + c0, k0);
                let mut r0 = 0;
                for (t, &mr) in tiles.iter().enumerate() {
                    // the first row tile prefetches its columns AHEAD terms further down
                    let pf = if t > 0 { 0 } else { AHEAD * ks };
                    let at = acc.as_mut_ptr().add(r0 * chunk + c0);
                    let x = x0.add(r0 * ldx + k0);
                    let tile = Tile {
                        kb,
                        x,
                        ldx,
                        w: wt,
                        ks,
                        ps,
                        acc: at,
                        lda: chunk,
                        first: k0 == 0,
                        pf,
                    };
                    if wide {
                        zmm::dispatch(mr, width / 16, &tile);
                    } else if width == tw {
                        dispatch(mr, nv, &tile);
                    } else {
                        edge(mr, width, &tile);
                    }
                    r0 += mr;
                }
                c0 += width;
            }
            k0 += kb;
        }
        for r in 0..m {
            job.write(i0 + r, j0, &acc[r * chunk..r * chunk + cols]);
        }
        j0 += cols;
    }
}

/// One tile's operands for one block: `x` (`MR` rows `ldx` apart, from the block's first term), `w`
/// (the tile's first column at the block's first `k`), the block sums `acc` (rows `lda` apart; stored on
/// the first block, added to after), and how far ahead to prefetch.
pub(crate) struct Tile<T> {
    pub kb: usize,
    pub x: *const f32,
    pub ldx: usize,
    pub w: *const T,
    /// elements between consecutive `k` of one column
    pub ks: usize,
    /// elements between a column and the one 16 further (16 in K-major, the panel stride in panels)
    pub ps: usize,
    pub acc: *mut f32,
    pub lda: usize,
    pub first: bool,
    /// elements ahead of each panel's row to prefetch, per `k` (0: none)
    pub pf: usize,
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dispatch<T: Elem>(mr: usize, nv: usize, t: &Tile<T>) {
    macro_rules! go {
        ($($mr:literal, $nv:literal);*) => {
            match (mr, nv) {
                $(($mr, $nv) => micro::<T, $mr, $nv>(t),)*
                _ => unreachable!("tile {mr} x {nv}"),
            }
        };
    }
    go!(1, 8; 2, 4; 3, 4; 3, 2; 4, 2; 5, 2; 6, 2)
}

/// A tile narrower than the plan's (the chunk's last columns): whole vectors one at a time, then the
/// last columns one by one (K-major only: panels are computed in whole vectors, padded at N's edge).
#[target_feature(enable = "avx2,fma")]
unsafe fn edge<T: Elem>(mr: usize, width: usize, t: &Tile<T>) {
    let mut c = 0;
    while c + 8 <= width {
        let tv = Tile {
            w: t.w.add((c / 16) * t.ps + c % 16),
            acc: t.acc.add(c),
            pf: 0,
            ..*t
        };
        macro_rules! go {
            ($($mr:literal),*) => {
                match mr {
                    $($mr => micro::<T, $mr, 1>(&tv),)*
                    _ => unreachable!("tile {mr} x 1"),
                }
            };
        }
        go!(1, 2, 3, 4, 5, 6);
        c += 8;
    }
    for j in c..width {
        for r in 0..mr {
            let mut s = 0.0f32;
            for kk in 0..t.kb {
                s = (*t.x.add(r * t.ldx + kk)).mul_add(T::load1(t.w.add(kk * t.ks + j)), s);
            }
            let dst = t.acc.add(r * t.lda + j);
            *dst = if t.first { s } else { *dst + s };
        }
    }
}

impl<T> Clone for Tile<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Tile<T> {}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn micro<T: Elem, const MR: usize, const NV: usize>(t: &Tile<T>) {
    let mut c = [[_mm256_setzero_ps(); NV]; MR];
    let (x, w) = (t.x, t.w);
    for kk in 0..t.kb {
        let wk = w.add(kk * t.ks);
        if t.pf != 0 {
            for g in 0..NV.div_ceil(2) {
                // wrapping: near the end it points past the weights (a prefetch does not fault)
                _mm_prefetch::<_MM_HINT_T0>(wk.wrapping_add(g * t.ps + t.pf) as *const i8);
            }
        }
        let mut b = [_mm256_setzero_ps(); NV];
        for v in 0..NV {
            b[v] = T::load8(wk.add((v / 2) * t.ps + (v % 2) * 8));
        }
        for r in 0..MR {
            let a = _mm256_broadcast_ss(&*x.add(r * t.ldx + kk));
            for v in 0..NV {
                c[r][v] = _mm256_fmadd_ps(a, b[v], c[r][v]);
            }
        }
    }
    for r in 0..MR {
        for v in 0..NV {
            let dst = t.acc.add(r * t.lda + 8 * v);
            let val = if t.first {
                c[r][v]
            } else {
                _mm256_add_ps(_mm256_loadu_ps(dst), c[r][v])
            };
            _mm256_storeu_ps(dst, val);
        }
    }
}
