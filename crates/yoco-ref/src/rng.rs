//! A tiny seeded generator (SplitMix64) and a hash mixer.
//!
//! Why not `rand`: golden fixtures and failing-seed reports must reproduce bit for bit forever, so the
//! stream may not depend on another crate's algorithm choice or version.

/// SplitMix64: 64 bits of state, passes BigCrush, trivially reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose whole stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in `0..n` (n > 0). The modulo bias is irrelevant at the sizes used here.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "Rng::range({lo}, {hi})");
        lo + self.below(hi - lo + 1)
    }

    /// Uniform index into a non-empty slice.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit_f64() < p
    }

    /// Uniform in `[0, 1)`, 53 random bits.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[-1, 1)`, exactly representable (24 random bits), so values round-trip through
    /// any f32 path unchanged.
    pub fn sym_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
    }

    /// Fisher-Yates shuffle in place, uniform over permutations.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            xs.swap(i, j);
        }
    }
}

/// The SplitMix64 finaliser: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Combines a running hash with one more word (order-sensitive).
pub fn chain(h: u64, x: u64) -> u64 {
    mix64(h ^ mix64(x.wrapping_add(0x632B_E59B_D9B4_E019)))
}
