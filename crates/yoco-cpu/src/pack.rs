//! Weight access for the kernels: bf16 widening loads (8 lanes for AVX2, 16 for AVX-512), and packing a tile of output columns of a
//! row-major `w` into a panel `[K][NR]` of f32 (one `k` of NR outputs per row, what a register tile
//! consumes) by 8 x 8 register transposes.

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

/// An element type the kernels read as f32: f32 itself, or bf16 bits (widened exactly).
pub(crate) trait Elem: Copy {
    /// Eight consecutive values at `p` as f32.
    unsafe fn load8(p: *const Self) -> __m256;
    /// One value at `p` as f32.
    unsafe fn load1(p: *const Self) -> f32;
    /// Sixteen consecutive values at `p` as f32 (AVX-512F only).
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        load8_f32(p)
    }
    #[inline(always)]
    unsafe fn load1(p: *const f32) -> f32 {
        *p
    }
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        load16_f32(p)
    }
}

impl Elem for u16 {
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        load8_bf16(p)
    }
    #[inline(always)]
    unsafe fn load1(p: *const u16) -> f32 {
        crate::reference::bf16_to_f32(*p)
    }
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> __m512 {
        load16_bf16(p)
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load8_f32(p: *const f32) -> __m256 {
    _mm256_loadu_ps(p)
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load8_bf16(p: *const u16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16_f32(p: *const f32) -> __m512 {
    _mm512_loadu_ps(p)
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16_bf16(p: *const u16) -> __m512 {
    let h = _mm256_loadu_si256(p as *const __m256i);
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

/// 8 x 8 transpose: `out[t]` holds element `t` of every input row.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn transpose8(r: &[__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// Row-major `w` (row `j` at `w + j * ldw`): `panel[kk][jj] = w[jj][kk]`, `jj < cols` (0 beyond),
/// `kk < k`, `8 nv` columns per panel row.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn pack_row_major<T: Elem>(
    w: *const T,
    ldw: usize,
    cols: usize,
    k: usize,
    nv: usize,
    panel: *mut f32,
) {
    let nr = 8 * nv;
    let k8 = k / 8 * 8;
    for g in 0..nv {
        let j = 8 * g;
        if j + 8 <= cols {
            let mut rows = [w; 8];
            for (r, p) in rows.iter_mut().enumerate() {
                *p = w.add((j + r) * ldw);
            }
            let mut kk = 0;
            while kk < k8 {
                let mut v = [_mm256_setzero_ps(); 8];
                for r in 0..8 {
                    v[r] = T::load8(rows[r].add(kk));
                }
                let t = transpose8(&v);
                for (q, tv) in t.iter().enumerate() {
                    _mm256_storeu_ps(panel.add((kk + q) * nr + j), *tv);
                }
                kk += 8;
            }
            for kk in k8..k {
                for (r, p) in rows.iter().enumerate() {
                    *panel.add(kk * nr + j + r) = T::load1(p.add(kk));
                }
            }
        } else {
            for kk in 0..k {
                for r in 0..8 {
                    *panel.add(kk * nr + j + r) = if j + r < cols {
                        T::load1(w.add((j + r) * ldw + kk))
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}
