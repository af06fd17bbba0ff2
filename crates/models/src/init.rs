//! Deterministic weights for the demo models.

/// SplitMix64: a tiny, well-known generator; the same seed gives the same
/// weights on every platform.
pub struct Weights {
    state: u64,
}

impl Weights {
    /// A stream for one model and one tensor name.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// A rows×cols matrix with entries uniform in ±scale/√rows (fan-in scaling).
    pub fn matrix(&mut self, rows: usize, cols: usize, scale: f64) -> Vec<f64> {
        let s = scale / (rows as f64).sqrt();
        (0..rows * cols).map(|_| self.uniform() * s).collect()
    }
}
