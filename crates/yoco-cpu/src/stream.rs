//! The streaming kernel for K-major weights (how the executor stores CPU weights): reads `w` front to
//! back like a GEMV, once per `ROW_CHUNK` rows.
//!
//! K-major `w` holds, for each `k`, the weights of all outputs side by side, so a vector is one `k` of
//! eight outputs and the sequential FMA chain of each output needs no transpose. Per chunk of `CHUNK`
//! columns and per group of up to `Plan::group` consecutive `k` of a block, every output's chain is
//! loaded (or starts at +0 on the block's first group), advanced by the group's FMAs in order, and stored
//! back (into the block sum, added in order, on the block's last group): `group` consecutive `k` rows of
//! the chunk are that many sequential streams, and the chain buffers stay in L2 (a few rows) or L3.
//!
//! The work of a group is done in register tiles ([`micro`]): `MR` rows x `NV` vectors of chains held
//! in registers over the group's `k`, each weight vector loaded once for the tile's rows and each `x`
//! value broadcast once for its `NV` vectors; one generic kernel over the weight element (f32 or bf16
//! bits, [`Elem`]) and the tile shape, for every row count. The chains of a tile are independent of each
//! other, which hides the FMA latency the sequential order imposes. One row is memory-bound: a 1 x 4 tile.
//! Several rows are FMA-bound (every weight feeds each row's chain): 4 x 2 tiles, where a weight vector
//! feeds 4 FMAs and a broadcast 2, and the first row tile prefetches the weights of the sub-chunks ahead
//! so that memory reads overlap the other tiles' arithmetic (the former 2-row kernel over groups of 4 `k`
//! stored every chain twice as often, and nothing read ahead while the other rows computed).

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
/// Bytes of weights per sub-chunk (`group` rows of `w` x the sub-chunk's columns): read from memory by
/// the first row tile, from L1 by the others.
const SUB_BYTES: usize = 16 << 10;

/// How `m` rows are computed: register tiles of `mr` rows x `nv` vectors (the last row tile takes the
/// remainder; a sub-chunk's last vectors are 1 wide), over groups of `group` consecutive `k` of `CHUNK`
/// columns, the first row tile prefetching `prefetch` sub-chunks ahead.
///
/// Measured at E2B's shapes at 8 rows (`examples/e2b_shapes.rs`, one thread, on the shared 2-core box at
/// load average 8-11, so only differences of ~20% or more were told apart): groups of
/// 8 `k` beat 16 and 32 (more weight streams, which the hardware prefetchers follow worse) and 4 (more
/// chain traffic); 4 x 2 tiles beat 8 x 1 (8 broadcasts per weight vector), 6 x 2 and 4 x 3 (no faster,
/// more registers); prefetching the next sub-chunks' weights lets the memory reads go on while the other
/// row tiles compute from L1.
#[derive(Clone, Copy, Debug)]
struct Plan {
    mr: usize,
    nv: usize,
    group: usize,
    prefetch: usize,
}

fn plan(m: usize) -> Plan {
    if m == 1 {
        Plan {
            mr: 1,
            nv: 4,
            group: 8,
            prefetch: 0,
        }
    } else {
        Plan {
            mr: 4,
            nv: 2,
            group: 8,
            prefetch: 2,
        }
    }
}

/// The longest group.
const GROUP_MAX: usize = 8;

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
    let p = plan(m);
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
            while g0 < k1 {
                let g = p.group.min(k1 - g0);
                let step = Step {
                    first: g0 == k0,
                    last: g0 + g == k1,
                    first_block: k0 == 0,
                };
                let op = Group {
                    m,
                    g,
                    x: x0.add(g0),
                    ldx: job.ldx,
                    w: w.add(g0 * job.ldw + j0),
                    ldk: job.ldw,
                    chain: chain.as_mut_ptr(),
                    sum: sum.as_mut_ptr(),
                    s: step,
                    pf: 0,
                };
                group(&op, p, cols);
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

/// One group of `g` consecutive `k` for `m` rows of a chunk: `x` at the group's first `k` (rows `ldx`
/// apart), `w` at the group's first `k` and the chunk's first column (`k` rows `ldk` apart); the chain
/// and sum buffers (rows `ROW` apart) at the chunk's first column.
#[derive(Clone, Copy)]
struct Group<T> {
    m: usize,
    g: usize,
    x: *const f32,
    ldx: usize,
    w: *const T,
    ldk: usize,
    chain: *mut f32,
    sum: *mut f32,
    s: Step,
    /// Elements ahead of a tile's weights that its first row tile prefetches (0: none).
    pf: usize,
}

/// The group over `cols` columns, in sub-chunks of about `SUB_BYTES` of weights: per sub-chunk, each row
/// tile sweeps it (the first reads the weights from memory, the others from L1), and the sub-chunks
/// follow each other along the group's `k` rows.
#[target_feature(enable = "avx2,fma")]
unsafe fn group<T: Elem>(op: &Group<T>, p: Plan, cols: usize) {
    // the group's x values side by side (rows `g` apart): rows of a batch `ldx` apart may fall into one
    // L1 set (K = 2048 floats is 8 KiB), and the tiles broadcast them from there every `k`
    let mut xs = [0f32; ROW_CHUNK * GROUP_MAX];
    for r in 0..op.m {
        for t in 0..op.g {
            xs[r * op.g + t] = *op.x.add(r * op.ldx + t);
        }
    }
    let op = &Group {
        x: xs.as_ptr(),
        ldx: op.g,
        ..*op
    };
    let vecs = cols / 8;
    let sub = (SUB_BYTES / (op.g * 8 * std::mem::size_of::<T>())).max(p.nv);
    let op = &Group {
        pf: p.prefetch * 8 * sub,
        ..*op
    };
    let mut v0 = 0;
    while v0 < vecs {
        let v1 = (v0 + sub).min(vecs);
        let mut r0 = 0;
        while r0 < op.m {
            let tr = p.mr.min(op.m - r0);
            let mut v = v0;
            while v + p.nv <= v1 {
                tile(op, tr, p.nv, r0, 8 * v);
                v += p.nv;
            }
            while v < v1 {
                tile(op, tr, 1, r0, 8 * v);
                v += 1;
            }
            r0 += tr;
        }
        v0 = v1;
    }
    tail(op, 8 * vecs, cols);
}

/// The `tr x nv` register tile at row `r0`, column `j` of the chunk.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<T: Elem>(op: &Group<T>, tr: usize, nv: usize, r0: usize, j: usize) {
    macro_rules! go {
        ($($mr:literal, $nv:literal);*) => {
            match (tr, nv) {
                $(($mr, $nv) => micro::<T, $mr, $nv>(op, r0, j),)*
                _ => unreachable!("tile {tr} x {nv}"),
            }
        };
    }
    go!(1, 4; 1, 1;
        4, 2; 4, 1; 3, 2; 3, 1; 2, 2; 2, 1; 1, 2)
}

/// `MR` rows x `NV` vectors of chains, advanced over the group's `g` `k` in order.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn micro<T: Elem, const MR: usize, const NV: usize>(op: &Group<T>, r0: usize, j: usize) {
    let at = r0 * ROW + j;
    let mut c = [[_mm256_setzero_ps(); NV]; MR];
    if !op.s.first {
        for r in 0..MR {
            for v in 0..NV {
                c[r][v] = _mm256_loadu_ps(op.chain.add(at + r * ROW + 8 * v));
            }
        }
    }
    let mut wk = op.w.add(j);
    let mut xk = op.x.add(r0 * op.ldx);
    let pf = if r0 == 0 { op.pf } else { 0 };
    for _ in 0..op.g {
        if pf != 0 {
            _mm_prefetch::<_MM_HINT_T0>(wk.wrapping_add(pf) as *const i8);
        }
        let mut b = [_mm256_setzero_ps(); NV];
        for v in 0..NV {
            b[v] = T::load8(wk.add(8 * v));
        }
        for r in 0..MR {
            let a = _mm256_broadcast_ss(&*xk.add(r * op.ldx));
            for v in 0..NV {
                c[r][v] = _mm256_fmadd_ps(a, b[v], c[r][v]);
            }
        }
        wk = wk.add(op.ldk);
        xk = xk.add(1);
    }
    for r in 0..MR {
        for v in 0..NV {
            finish(op, c[r][v], at + r * ROW + 8 * v);
        }
    }
}

/// The columns `from..cols` past the last full vector, one at a time (the same FMAs in the same order).
#[target_feature(enable = "avx2,fma")]
unsafe fn tail<T: Elem>(op: &Group<T>, from: usize, cols: usize) {
    let s = op.s;
    for j in from..cols {
        for r in 0..op.m {
            let at = r * ROW + j;
            let mut c = if s.first { 0.0f32 } else { *op.chain.add(at) };
            for t in 0..op.g {
                c = (*op.x.add(r * op.ldx + t)).mul_add(T::load1(op.w.add(t * op.ldk + j)), c);
            }
            if !s.last {
                *op.chain.add(at) = c;
            } else {
                let p = op.sum.add(at);
                *p = if s.first_block { c } else { *p + c };
            }
        }
    }
}

/// A chain vector after its group: kept for the next group, or (the block's last) added to the sum.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn finish<T>(op: &Group<T>, c: __m256, at: usize) {
    let s = op.s;
    if !s.last {
        _mm256_storeu_ps(op.chain.add(at), c);
    } else if s.first_block {
        _mm256_storeu_ps(op.sum.add(at), c);
    } else {
        let p = op.sum.add(at);
        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), c));
    }
}
