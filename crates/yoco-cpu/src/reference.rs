//! The summation order of the crate, written out one output at a time: the specification the AVX2
//! kernel is tested against bit for bit (and a readable statement of what MKL's GEMM computes).

/// bf16 bits -> f32 (exact: bf16 is the top half of an f32).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 -> bf16 bits, rounded to nearest even (as torch's `.to(torch.bfloat16)`); NaN stays a quiet NaN.
#[inline]
pub fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if v.is_nan() {
        return ((u >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((u >> 16) & 1);
    (u.wrapping_add(round) >> 16) as u16
}

/// One output: blocks of `kc` terms, each a sequential FMA chain from +0, the block sums added in order.
pub fn dot(x: &[f32], w: &[f32], kc: usize) -> f32 {
    assert_eq!(x.len(), w.len());
    let mut y = 0.0f32;
    for (b, (xs, ws)) in x.chunks(kc).zip(w.chunks(kc)).enumerate() {
        let mut c = 0.0f32;
        for (a, v) in xs.iter().zip(ws) {
            c = a.mul_add(*v, c);
        }
        y = if b == 0 { c } else { y + c };
    }
    y
}

/// `y = x · wᵀ` (row-major, contiguous): `x: m x k`, `w: n x k`, `y: m x n`.
pub fn linear_f32(x: &[f32], w: &[f32], m: usize, n: usize, k: usize, kc: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = dot(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k], kc);
        }
    }
    y
}

/// The bf16 form: widened, [`linear_f32`], rounded once.
pub fn linear_bf16(x: &[u16], w: &[u16], m: usize, n: usize, k: usize, kc: usize) -> Vec<u16> {
    let xf: Vec<f32> = x.iter().map(|&b| bf16_to_f32(b)).collect();
    let wf: Vec<f32> = w.iter().map(|&b| bf16_to_f32(b)).collect();
    linear_f32(&xf, &wf, m, n, k, kc)
        .into_iter()
        .map(f32_to_bf16)
        .collect()
}
