//! The panel kernel's AVX-512 register tiles: one zmm register holds one panel's 16 columns at one `k`.
//!
//! Why: at 8 rows the AVX2 tiles are bound by the FMA units, not by memory (f32: 8 rows cost ~2x one
//! row's time for the same weight bytes, measured in `examples/e2b_shapes.rs`). A 512-bit FMA does
//! twice the work of a 256-bit one at the same issue rate where the core has two 512-bit FMA units
//! (Sapphire Rapids and later Xeons: 4.4 G FMAs/s either width on this project's machine), so the
//! same tiles at twice the width halve that bound. Each output still gets one sequential FMA chain
//! per `kc` block added into the block sums in order (the crate doc's order): the bits are the AVX2
//! kernel's, whichever runs (`tests/linear.rs` runs both).
//!
//! Shapes: tiles of 4-8 rows x 2 panels (8-16 chains, at most 19 of the 32 registers; per `k` 2 weight
//! loads and 8 broadcasts for 16 FMAs). With at most 8 rows a tile column is one row tile: every weight
//! line is loaded into a register once. Below [`MIN_ROWS`] rows the AVX2 tiles run: there the kernel is
//! bound by memory, not by the FMAs, and the 512-bit tiles made the whole 1-row step *slower*
//! (one E2B step A/B at 1 stream: f32 1339 against 681 ms, bf16 422 against 393; not located, the
//! core's clock under 512-bit load is a guess).
//!
//! [`MIN_ROWS`]: the fewest rows the AVX-512 tiles run for.

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

use crate::pack::Elem;
use crate::resident::Tile;

/// The fewest rows the AVX-512 tiles run for (see the module doc).
pub(crate) const MIN_ROWS: usize = 4;

/// Panels per tile and the rows of each tile for `m >= MIN_ROWS` rows: tiles of 4-8 rows.
pub(crate) fn plan(m: usize) -> (usize, Vec<usize>) {
    debug_assert!(m >= MIN_ROWS);
    let t = m.div_ceil(8);
    (2, (0..t).map(|i| m / t + usize::from(i < m % t)).collect())
}

/// The `mr x np` tile over one block (`np` may be below the plan's at the last panels of N).
///
/// # Safety
/// As [`crate::resident::columns`], and AVX-512F is available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn dispatch<T: Elem>(mr: usize, np: usize, t: &Tile<T>) {
    macro_rules! go {
        ($($mr:literal, $np:literal);*) => {
            match (mr, np) {
                $(($mr, $np) => micro::<T, $mr, $np>(t),)*
                _ => unreachable!("zmm tile {mr} x {np}"),
            }
        };
    }
    go!(4, 1; 4, 2; 5, 1; 5, 2; 6, 1; 6, 2; 7, 1; 7, 2; 8, 1; 8, 2)
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn micro<T: Elem, const MR: usize, const NP: usize>(t: &Tile<T>) {
    let mut c = [[_mm512_setzero_ps(); NP]; MR];
    let (x, w) = (t.x, t.w);
    for kk in 0..t.kb {
        let wk = w.add(kk * t.ks);
        if t.pf != 0 {
            for p in 0..NP {
                // wrapping: near the end it points past the weights (a prefetch does not fault)
                _mm_prefetch::<_MM_HINT_T0>(wk.wrapping_add(p * t.ps + t.pf) as *const i8);
            }
        }
        let mut b = [_mm512_setzero_ps(); NP];
        for p in 0..NP {
            b[p] = T::load16(wk.add(p * t.ps));
        }
        for r in 0..MR {
            let a = _mm512_set1_ps(*x.add(r * t.ldx + kk));
            for p in 0..NP {
                c[r][p] = _mm512_fmadd_ps(a, b[p], c[r][p]);
            }
        }
    }
    for r in 0..MR {
        for p in 0..NP {
            let dst = t.acc.add(r * t.lda + 16 * p);
            let val = if t.first {
                c[r][p]
            } else {
                _mm512_add_ps(_mm512_loadu_ps(dst), c[r][p])
            };
            _mm512_storeu_ps(dst, val);
        }
    }
}
