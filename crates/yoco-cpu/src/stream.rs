//! The streaming kernel for K-major weights (how the executor stores CPU weights): reads `w` front to
//! back like a GEMV, once per `ROW_CHUNK` rows.
//!
//! K-major `w` holds, for each `k`, the weights of all outputs side by side, so eight consecutive `k`
//! rows of a column chunk are eight sequential streams and one vector is one `k` of eight outputs: the
//! sequential FMA chain of each output needs no transpose. Per chunk of `CHUNK` columns and per group of
//! up to 8 consecutive `k` of a block, every output vector's chain is loaded (or starts at +0 on the
//! block's first group), advanced by the group's FMAs in order, and stored back (into the block sum,
//! added in order, on the block's last group). The chains of neighbouring vectors are independent, so
//! the FMA latency overlaps; the chain buffers stay in L1/L2. From about 6 rows on it is FMA-throughput
//! bound (eight `k` of one vector of weights feed every row's chain).

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

use crate::job::Job;
use crate::pack::Elem;

/// Rows per pass over `w`.
const ROW_CHUNK: usize = 16;
/// Output columns per chunk (the chain and block-sum buffers are `2 x rows x CHUNK` f32: 64 KiB a row).
const CHUNK: usize = 8192;
/// Row stride of those buffers: not a multiple of 4 KiB, so that the rows' lines do not all fall into
/// the same L1 sets (and evict each other and the weights).
const ROW: usize = CHUNK + 16;
/// Columns per sub-chunk (see `group8`).
const SUB: usize = 256;
/// Output vectors advanced together in `group8`.
const LANES: usize = 4;

/// Columns `lo..hi` of `y` (any `lo`).
///
/// # Safety
/// As `tile::columns`; `job.k_major`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn columns<T: Elem>(job: &Job, w: *const T, lo: usize, hi: usize) {
    debug_assert!(job.k_major);
    let rc = ROW_CHUNK.min(job.m);
    let mut chain = vec![0f32; rc * ROW];
    let mut sum = vec![0f32; rc * ROW];
    let mut i0 = 0;
    while i0 < job.m {
        let m = rc.min(job.m - i0);
        rows(job, w, i0, m, lo, hi, &mut chain, &mut sum);
        i0 += m;
    }
}

/// Rows `i0..i0 + m` (`m <= ROW_CHUNK`), columns `lo..hi`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<T: Elem>(
    job: &Job,
    w: *const T,
    i0: usize,
    m: usize,
    lo: usize,
    hi: usize,
    chain: &mut [f32],
    sum: &mut [f32],
) {
    let k = job.k;
    let kc = job.kc.min(k.max(1));
    let x0 = job.x.add(i0 * job.ldx);
    let mut j0 = lo;
    while j0 < hi {
        let cols = CHUNK.min(hi - j0);
        if k == 0 {
            sum[..m * ROW].fill(0.0);
        }
        let mut k0 = 0;
        while k0 < k {
            let k1 = (k0 + kc).min(k);
            let mut g0 = k0;
            // one row: groups of 8 k (fewer chain loads and stores); more: groups of 4 for two rows at a
            // time (each weight vector loaded once for both). The chains are the same either way.
            let step_k = if m == 1 { 8 } else { 4 };
            while g0 < k1 {
                let g = step_k.min(k1 - g0);
                let step = Step {
                    first: g0 == k0,
                    last: g0 + g == k1,
                    first_block: k0 == 0,
                };
                let wg = w.add(g0 * job.ldw + j0);
                let xg = x0.add(g0);
                if g == 8 {
                    group8::<T>(m, xg, job.ldx, wg, job.ldw, cols, chain, sum, step);
                } else if g == 4 {
                    group4::<T>(m, xg, job.ldx, wg, job.ldw, cols, chain, sum, step);
                } else {
                    group_any::<T>(m, g, xg, job.ldx, wg, job.ldw, cols, chain, sum, step);
                }
                g0 += g;
            }
            k0 = k1;
        }
        for r in 0..m {
            job.write(i0 + r, j0, &sum[r * ROW..r * ROW + cols]);
        }
        j0 += cols;
    }
}

#[derive(Clone, Copy)]
struct Step {
    /// The block's first group: chains start at +0.
    first: bool,
    /// The block's last group: the chains go into the block sum.
    last: bool,
    /// The first block: its chains *are* the sum so far.
    first_block: bool,
}

/// One group of 8 consecutive `k` (row stride `ldk` in `w`) for `rows` rows (used for one) and `cols`
/// columns, in sub-chunks of `SUB` columns: per sub-chunk, row by row, the row's eight `x` values stay in
/// registers while its chains sweep the sub-chunk, `LANES` vectors side by side. The sub-chunks follow
/// each other along the eight `k` rows: eight sequential streams over the whole chunk.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn group8<T: Elem>(
    rows: usize,
    x: *const f32,
    ldx: usize,
    w: *const T,
    ldk: usize,
    cols: usize,
    chain: &mut [f32],
    sum: &mut [f32],
    s: Step,
) {
    let vecs = cols / 8;
    let wt: [*const T; 8] = [
        w,
        w.add(ldk),
        w.add(2 * ldk),
        w.add(3 * ldk),
        w.add(4 * ldk),
        w.add(5 * ldk),
        w.add(6 * ldk),
        w.add(7 * ldk),
    ];
    let mut v0 = 0;
    while v0 < vecs {
        let v1 = (v0 + SUB / 8).min(vecs);
        for r in 0..rows {
            let xr = x.add(r * ldx);
            let xb: [__m256; 8] = [
                _mm256_set1_ps(*xr),
                _mm256_set1_ps(*xr.add(1)),
                _mm256_set1_ps(*xr.add(2)),
                _mm256_set1_ps(*xr.add(3)),
                _mm256_set1_ps(*xr.add(4)),
                _mm256_set1_ps(*xr.add(5)),
                _mm256_set1_ps(*xr.add(6)),
                _mm256_set1_ps(*xr.add(7)),
            ];
            let mut v = v0;
            while v + LANES <= v1 {
                // LANES independent chains side by side: the FMA latency overlaps within the iteration
                let j = 8 * v;
                let at = r * ROW + j;
                let mut c = [_mm256_setzero_ps(); LANES];
                if !s.first {
                    for (q, cq) in c.iter_mut().enumerate() {
                        *cq = _mm256_loadu_ps(chain.as_ptr().add(at + 8 * q));
                    }
                }
                for t in 0..8 {
                    for (q, cq) in c.iter_mut().enumerate() {
                        *cq = _mm256_fmadd_ps(xb[t], T::load8(wt[t].add(j + 8 * q)), *cq);
                    }
                }
                for (q, cq) in c.iter().enumerate() {
                    finish(*cq, chain, sum, at + 8 * q, s);
                }
                v += LANES;
            }
            for v in v..v1 {
                let j = 8 * v;
                let at = r * ROW + j;
                let mut c = if s.first {
                    _mm256_setzero_ps()
                } else {
                    _mm256_loadu_ps(chain.as_ptr().add(at))
                };
                for t in 0..8 {
                    c = _mm256_fmadd_ps(xb[t], T::load8(wt[t].add(j)), c);
                }
                finish(c, chain, sum, at, s);
            }
        }
        v0 = v1;
    }
    tail::<T>(rows, 8, x, ldx, w, ldk, 8 * vecs, cols, chain, sum, s);
}

/// One group of 4 consecutive `k` (row stride `ldk` in `w`) for `rows` rows and `cols` columns, in
/// sub-chunks of `SUB` columns: per sub-chunk, two rows at a time, the rows' four `x` values each stay in
/// registers while their chains sweep the sub-chunk (each weight vector loaded once for both rows). The
/// sub-chunk's weights (4 x `SUB`) come from memory for the first rows and from L1 for the others, and
/// the sub-chunks follow each other along the four `k` rows: four sequential streams over the chunk.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn group4<T: Elem>(
    rows: usize,
    x: *const f32,
    ldx: usize,
    w: *const T,
    ldk: usize,
    cols: usize,
    chain: &mut [f32],
    sum: &mut [f32],
    s: Step,
) {
    let vecs = cols / 8;
    let wt: [*const T; 4] = [w, w.add(ldk), w.add(2 * ldk), w.add(3 * ldk)];
    let mut v0 = 0;
    while v0 < vecs {
        let v1 = (v0 + SUB / 8).min(vecs);
        let mut r = 0;
        while r + 2 <= rows {
            let (xa, xb) = (x.add(r * ldx), x.add((r + 1) * ldx));
            let ba: [__m256; 4] = [
                _mm256_set1_ps(*xa),
                _mm256_set1_ps(*xa.add(1)),
                _mm256_set1_ps(*xa.add(2)),
                _mm256_set1_ps(*xa.add(3)),
            ];
            let bb: [__m256; 4] = [
                _mm256_set1_ps(*xb),
                _mm256_set1_ps(*xb.add(1)),
                _mm256_set1_ps(*xb.add(2)),
                _mm256_set1_ps(*xb.add(3)),
            ];
            for v in v0..v1 {
                let j = 8 * v;
                let (at, bt) = (r * ROW + j, (r + 1) * ROW + j);
                let (mut ca, mut cb) = if s.first {
                    (_mm256_setzero_ps(), _mm256_setzero_ps())
                } else {
                    (
                        _mm256_loadu_ps(chain.as_ptr().add(at)),
                        _mm256_loadu_ps(chain.as_ptr().add(bt)),
                    )
                };
                for t in 0..4 {
                    let wv = T::load8(wt[t].add(j));
                    ca = _mm256_fmadd_ps(ba[t], wv, ca);
                    cb = _mm256_fmadd_ps(bb[t], wv, cb);
                }
                finish(ca, chain, sum, at, s);
                finish(cb, chain, sum, bt, s);
            }
            r += 2;
        }
        if r < rows {
            let xa = x.add(r * ldx);
            let ba: [__m256; 4] = [
                _mm256_set1_ps(*xa),
                _mm256_set1_ps(*xa.add(1)),
                _mm256_set1_ps(*xa.add(2)),
                _mm256_set1_ps(*xa.add(3)),
            ];
            for v in v0..v1 {
                let j = 8 * v;
                let at = r * ROW + j;
                let mut c = if s.first {
                    _mm256_setzero_ps()
                } else {
                    _mm256_loadu_ps(chain.as_ptr().add(at))
                };
                for t in 0..4 {
                    c = _mm256_fmadd_ps(ba[t], T::load8(wt[t].add(j)), c);
                }
                finish(c, chain, sum, at, s);
            }
        }
        v0 = v1;
    }
    tail::<T>(rows, 4, x, ldx, w, ldk, 8 * vecs, cols, chain, sum, s);
}

/// The same for any row count and group size (block remainders, small K).
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn group_any<T: Elem>(
    rows: usize,
    g: usize,
    x: *const f32,
    ldx: usize,
    w: *const T,
    ldk: usize,
    cols: usize,
    chain: &mut [f32],
    sum: &mut [f32],
    s: Step,
) {
    let vecs = cols / 8;
    for v in 0..vecs {
        let j = 8 * v;
        for r in 0..rows {
            let at = r * ROW + j;
            let mut c = if s.first {
                _mm256_setzero_ps()
            } else {
                _mm256_loadu_ps(chain.as_ptr().add(at))
            };
            for t in 0..g {
                c = _mm256_fmadd_ps(
                    _mm256_set1_ps(*x.add(r * ldx + t)),
                    T::load8(w.add(t * ldk + j)),
                    c,
                );
            }
            finish(c, chain, sum, at, s);
        }
    }
    tail::<T>(rows, g, x, ldx, w, ldk, 8 * vecs, cols, chain, sum, s);
}

/// The columns past the last full vector, one at a time (the same FMAs in the same order).
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tail<T: Elem>(
    rows: usize,
    g: usize,
    x: *const f32,
    ldx: usize,
    w: *const T,
    ldk: usize,
    from: usize,
    cols: usize,
    chain: &mut [f32],
    sum: &mut [f32],
    s: Step,
) {
    for j in from..cols {
        for r in 0..rows {
            let at = r * ROW + j;
            let mut c = if s.first { 0.0f32 } else { chain[at] };
            for t in 0..g {
                c = (*x.add(r * ldx + t)).mul_add(T::load1(w.add(t * ldk + j)), c);
            }
            if !s.last {
                chain[at] = c;
            } else {
                sum[at] = if s.first_block { c } else { sum[at] + c };
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn finish(c: __m256, chain: &mut [f32], sum: &mut [f32], at: usize, s: Step) {
    if !s.last {
        _mm256_storeu_ps(chain.as_mut_ptr().add(at), c);
    } else if s.first_block {
        _mm256_storeu_ps(sum.as_mut_ptr().add(at), c);
    } else {
        let p = sum.as_mut_ptr().add(at);
        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), c));
    }
}
