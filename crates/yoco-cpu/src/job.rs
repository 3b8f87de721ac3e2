//! One call's operands as the kernels see them (checked by `linear_*` before any kernel runs), and
//! writing finished f32 rows out (copied, or rounded once to bf16).

use crate::reference::f32_to_bf16;

#[derive(Clone, Copy)]
pub(crate) enum WPtr {
    F32(*const f32),
    Bf16(*const u16),
}

#[derive(Clone, Copy)]
pub(crate) enum YPtr {
    F32(*mut f32),
    Bf16(*mut u16),
}

/// `y[m x n] = x[m x k] · wᵀ`, `x` as f32 (row stride `ldx`); `w` row-major (`w[j][k]` at `j * ldw + k`)
/// or K-major (`w[j][k]` at `k * ldw + j`); `y` row stride `ldy`; chains over blocks of `kc` terms.
pub(crate) struct Job {
    pub x: *const f32,
    pub ldx: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub w: WPtr,
    pub k_major: bool,
    /// `w` in panels of 16 columns: `w[j][k]` at `(j / 16) * ldw + k * 16 + j % 16`
    pub panels: bool,
    pub ldw: usize,
    /// AVX-512 tiles for panels (`zmm.rs`): the same bits, twice the FMA width
    pub wide: bool,
    pub y: YPtr,
    pub ldy: usize,
    pub kc: usize,
}

/// A `&Job` that may cross to a scoped worker thread (each writes its own columns of `y`).
pub(crate) struct SendJob<'a>(pub &'a Job);
unsafe impl Send for SendJob<'_> {}

impl Job {
    /// Where `w[j][k]` lies (`j` a multiple of 8 in panels).
    #[inline]
    pub unsafe fn at<T>(&self, w: *const T, j: usize, k: usize) -> *const T {
        if self.panels {
            w.add((j / 16) * self.ldw + k * 16 + j % 16)
        } else if self.k_major {
            w.add(k * self.ldw + j)
        } else {
            w.add(j * self.ldw + k)
        }
    }

    /// Writes `vals` (f32) into row `i` of `y` from column `j0`.
    ///
    /// # Safety
    /// `i < m` and `j0 + vals.len() <= n` for the buffers the job was checked against.
    #[inline]
    pub unsafe fn write(&self, i: usize, j0: usize, vals: &[f32]) {
        let at = i * self.ldy + j0;
        match self.y {
            YPtr::F32(y) => std::ptr::copy_nonoverlapping(vals.as_ptr(), y.add(at), vals.len()),
            YPtr::Bf16(y) => {
                for (c, v) in vals.iter().enumerate() {
                    *y.add(at + c) = f32_to_bf16(*v);
                }
            }
        }
    }
}
