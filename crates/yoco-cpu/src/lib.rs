//! yoco-rs CPU kernels: a linear layer `y = x · wᵀ` whose every output is rounded the same way whatever
//! the number of rows in the batch.
//!
//! Why: the executor's equivalence guarantees (prefill == decode bit for bit, a token's numbers
//! independent of the batch around it; `docs/DESIGN.md` §6-7) need every GEMM of a token to round
//! the same in a 600-token prefill and in a 1-row decode step. CPU BLAS (MKL) does that only from 4 rows
//! up; below, it takes a GEMV path that rounds differently, so the executor used to pad decode steps to 4
//! rows, and MKL's 4-row GEMM costs ~8 GEMVs at E2B's sizes. This crate computes any number of rows
//! (1, 3, 8, 600) with one fixed summation order, *the order MKL's GEMM uses from 4 rows up* (measured
//! on the locked torch build, see `python/yoco_rs/executor/cpu_linear.py`, which checks it at load and
//! falls back to padding where it does not hold):
//!
//! ```text
//! y[i][j] = c_0 + c_1 + ... (added left to right, in f32)
//! c_b     = fma(x[i][k_e], w[j][k_e], ... fma(x[i][k_s], w[j][k_s], +0.0))   k_s..k_e = block b = [b·kc, (b+1)·kc) ∩ [0, K)
//! ```
//!
//! i.e. sequential FMA chains over blocks of `kc` terms (192 for MKL's AVX2 sgemm at K ≥ 384), the
//! block sums added in order. Nothing in it depends on the row count, the other rows, N, the tile an
//! output lands in, or the thread that computes it. bf16 inputs are widened exactly to f32, summed in
//! the same order, and rounded once to bf16 (nearest even): the result is the f32 kernel's on the
//! widened values, rounded.
//!
//! Two AVX2 + FMA kernels ([`available`]) compute that order; which one runs changes no bit:
//! * `resident` (weights in [`Layout::Panels`], how the executor stores CPU weights, or K-major): register
//!   tiles of a few rows x 16-64 columns whose chains stay in registers over a whole `kc` block, each
//!   panel read front to back as one sequential stream (once per 96 rows); on panels with AVX-512F
//!   ([`avx512_enabled`]) the same tiles 16 columns a register (`zmm`);
//! * `tile` (row-major weights): packs the columns of a tile into an f32 panel by 8 x 8 transposes and
//!   runs an `MR x NR` register tile over it.
//!
//! [`reference`] is the scalar specification both are tested against bit for bit.

// Register tiles are indexed [row][vector] in fixed-size loops (unrolled): index loops say what they do.
#![allow(clippy::needless_range_loop)]

mod job;
#[cfg(target_arch = "x86_64")]
mod pack;
pub mod reference;
#[cfg(target_arch = "x86_64")]
mod resident;
#[cfg(target_arch = "x86_64")]
mod tile;
#[cfg(target_arch = "x86_64")]
mod zmm;

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use job::{Job, SendJob, WPtr, YPtr};

/// Whether the kernels run on this CPU (x86-64 with AVX2 and FMA).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has AVX-512F (the panel kernel's wide tiles, `zmm.rs`).
pub fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        available() && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether panel weights run the AVX-512 tiles: 0 not decided yet, 1 no, 2 yes.
static WIDE: AtomicU8 = AtomicU8::new(0);

/// Whether calls on [`Layout::Panels`] weights use the AVX-512 tiles: where the CPU has them, unless
/// `YOCO_CPU_AVX512=0` was set when first asked or [`set_avx512`] turned them off. Which tiles run
/// changes no bit (the crate doc's order either way); it changes the speed (2x the FMA width).
pub fn avx512_enabled() -> bool {
    match WIDE.load(Ordering::Relaxed) {
        0 => {
            let off = std::env::var("YOCO_CPU_AVX512").is_ok_and(|v| v == "0");
            set_avx512(!off)
        }
        v => v == 2,
    }
}

/// Turns the AVX-512 tiles on or off for this process (tests of both paths, A/B timings); returns
/// whether they are now on (never where the CPU lacks AVX-512F).
pub fn set_avx512(on: bool) -> bool {
    let on = on && avx512_available();
    WIDE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    on
}

/// A row-major matrix: `rows x cols` elements, row `r` starting at `data[r * ld]`.
#[derive(Clone, Copy)]
pub struct Mat<'a, T> {
    pub data: &'a [T],
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
}

/// A mutable row-major matrix (see [`Mat`]).
pub struct MatMut<'a, T> {
    pub data: &'a mut [T],
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
}

/// How the weight matrix `w` (`n` outputs x `k` inputs) lies in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `w[j][k]` at `data[j * ld + k]` (torch's contiguous `[N, K]`).
    RowMajor { ld: usize },
    /// `w[j][k]` at `data[k * ld + j]` (the `[N, K]` view of a contiguous `[K, N]`).
    KMajor { ld: usize },
    /// Panels of [`PANEL`] outputs: `w[j][k]` at `data[(j / PANEL) * ld + k * PANEL + j % PANEL]`
    /// (`ld >= PANEL * k`; the last panel padded to `PANEL` columns): one sequential stream per panel.
    Panels { ld: usize },
}

/// Output columns per panel of [`Layout::Panels`].
pub const PANEL: usize = 16;

/// The weights: `n x k`, laid out as `layout` says.
#[derive(Clone, Copy)]
pub struct Weights<'a, T> {
    pub data: &'a [T],
    pub n: usize,
    pub k: usize,
    pub layout: Layout,
}

/// What a call got wrong (shapes that do not line up, a buffer too short, no AVX2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinearError {
    Shape(String),
    Unavailable,
}

impl fmt::Display for LinearError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinearError::Shape(s) => write!(f, "{s}"),
            LinearError::Unavailable => {
                write!(f, "the CPU linear kernel needs x86-64 with AVX2 and FMA")
            }
        }
    }
}

impl std::error::Error for LinearError {}

fn shape(msg: String) -> LinearError {
    LinearError::Shape(msg)
}

/// Elements a `rows x cols` block with row stride `ld` spans (error when `ld < cols` or the buffer is short).
fn check_span(
    name: &str,
    len: usize,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<(), LinearError> {
    if rows > 1 && ld < cols {
        return Err(shape(format!("{name}: stride {ld} < {cols}")));
    }
    let need = if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * ld + cols
    };
    if len < need {
        return Err(shape(format!(
            "{name}: {rows} x {cols} with stride {ld} needs {need} elements, the buffer has {len}"
        )));
    }
    Ok(())
}

fn check<A, W, Y>(x: &Mat<A>, w: &Weights<W>, y: &MatMut<Y>, kc: usize) -> Result<(), LinearError> {
    if kc == 0 {
        return Err(shape("kc must be at least 1".into()));
    }
    if x.cols != w.k {
        return Err(shape(format!(
            "x has {} columns, w has {} inputs (K must agree)",
            x.cols, w.k
        )));
    }
    if y.rows != x.rows || y.cols != w.n {
        return Err(shape(format!(
            "y is {} x {}, expected {} x {} (rows of x x outputs of w)",
            y.rows, y.cols, x.rows, w.n
        )));
    }
    check_span("x", x.data.len(), x.rows, x.cols, x.ld)?;
    match w.layout {
        Layout::RowMajor { ld } => check_span("w (row-major)", w.data.len(), w.n, w.k, ld)?,
        Layout::KMajor { ld } => check_span("w (K-major)", w.data.len(), w.k, w.n, ld)?,
        Layout::Panels { ld } => check_span(
            "w (panels)",
            w.data.len(),
            w.n.div_ceil(PANEL),
            PANEL * w.k,
            ld,
        )?,
    }
    check_span("y", y.data.len(), y.rows, y.cols, y.ld)
}

/// (K-major, panels, stride) of a layout.
fn ld_of(layout: Layout) -> (bool, bool, usize) {
    match layout {
        Layout::RowMajor { ld } => (false, false, ld),
        Layout::KMajor { ld } => (true, false, ld),
        Layout::Panels { ld } => (false, true, ld),
    }
}

/// `y = x · wᵀ` in f32 (`x: M x K`, `w: N x K`, `y: M x N`) in the fixed order of the crate doc, with
/// blocks of `kc` terms, on up to `threads` threads (split over N: the same bits on any count).
pub fn linear_f32(
    x: Mat<f32>,
    w: Weights<f32>,
    y: MatMut<f32>,
    kc: usize,
    threads: usize,
) -> Result<(), LinearError> {
    check(&x, &w, &y, kc)?;
    if !available() {
        return Err(LinearError::Unavailable);
    }
    let (k_major, panels, ldw) = ld_of(w.layout);
    let job = Job {
        x: x.data.as_ptr(),
        ldx: x.ld,
        m: x.rows,
        n: w.n,
        k: w.k,
        w: WPtr::F32(w.data.as_ptr()),
        k_major,
        panels,
        ldw,
        wide: panels && avx512_enabled(),
        y: YPtr::F32(y.data.as_mut_ptr()),
        ldy: y.ld,
        kc,
    };
    // SAFETY: shapes and buffer lengths were checked above; AVX2 + FMA are present.
    unsafe { run(&job, threads) };
    Ok(())
}

/// `y = x · wᵀ` for bf16 `x`, `w`, `y` (raw bf16 bits): widened to f32, the f32 order, rounded once.
pub fn linear_bf16(
    x: Mat<u16>,
    w: Weights<u16>,
    y: MatMut<u16>,
    kc: usize,
    threads: usize,
) -> Result<(), LinearError> {
    check(&x, &w, &y, kc)?;
    if !available() {
        return Err(LinearError::Unavailable);
    }
    let (m, k) = (x.rows, x.cols);
    // x widened once (exact), so the kernels read f32 rows
    let mut xf = vec![0f32; m * k];
    for r in 0..m {
        let src = &x.data[r * x.ld..r * x.ld + k];
        for (d, s) in xf[r * k..(r + 1) * k].iter_mut().zip(src) {
            *d = reference::bf16_to_f32(*s);
        }
    }
    let (k_major, panels, ldw) = ld_of(w.layout);
    let job = Job {
        x: xf.as_ptr(),
        ldx: k,
        m,
        n: w.n,
        k,
        w: WPtr::Bf16(w.data.as_ptr()),
        k_major,
        panels,
        ldw,
        wide: panels && avx512_enabled(),
        y: YPtr::Bf16(y.data.as_mut_ptr()),
        ldy: y.ld,
        kc,
    };
    // SAFETY: as in linear_f32; `xf` outlives the call.
    unsafe { run(&job, threads) };
    Ok(())
}

/// Which kernel a job takes, and the column granularity its threads split at.
#[cfg(target_arch = "x86_64")]
fn plan(job: &Job) -> (bool, usize) {
    let resident_kernel = job.k_major || job.panels;
    (
        resident_kernel,
        if resident_kernel {
            64
        } else {
            8 * tile::tile(job.m).1
        },
    )
}

/// Columns `lo..hi` of `job` on this thread.
#[cfg(target_arch = "x86_64")]
unsafe fn columns(job: &Job, resident_kernel: bool, lo: usize, hi: usize) {
    match (resident_kernel, job.w) {
        (true, WPtr::F32(w)) => resident::columns(job, w, lo, hi),
        (true, WPtr::Bf16(w)) => resident::columns(job, w, lo, hi),
        (false, WPtr::F32(w)) => tile::columns(job, w, lo, hi),
        (false, WPtr::Bf16(w)) => tile::columns(job, w, lo, hi),
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn run(_job: &Job, _threads: usize) {
    unreachable!("linear_* checks available() first");
}

/// Runs `job` over its output columns, split into up to `threads` contiguous ranges.
#[cfg(target_arch = "x86_64")]
unsafe fn run(job: &Job, threads: usize) {
    let n = job.n;
    if job.m == 0 || n == 0 {
        return;
    }
    let (resident_kernel, unit) = plan(job);
    let units = n.div_ceil(unit);
    let parts = threads.clamp(1, units.max(1));
    if parts == 1 {
        columns(job, resident_kernel, 0, n);
        return;
    }
    let per = units.div_ceil(parts) * unit;
    std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(parts - 1);
        for p in 1..parts {
            let (lo, hi) = ((p * per).min(n), ((p + 1) * per).min(n));
            if lo < hi {
                let job = SendJob(job);
                handles.push(s.spawn(move || {
                    let job = job;
                    // SAFETY: disjoint column ranges of y; the inputs are only read.
                    unsafe { columns(job.0, resident_kernel, lo, hi) }
                }));
            }
        }
        columns(job, resident_kernel, 0, per.min(n));
        for h in handles {
            h.join().expect("a CPU linear worker panicked");
        }
    });
}
