//! Which vector instruction set a kernel compiled several times runs.

/// The instruction sets hot kernels are compiled for, best first; each
/// copy of a kernel compiles the same Rust code (no fused multiply-adds are
/// formed from separate `*` and `+`), so every copy gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 (F, VL) with AVX2 and FMA: 32 vector registers.
    Avx512,
    /// AVX2 and FMA.
    Avx2,
    /// The build's baseline.
    Base,
}

impl Isa {
    /// The best version the running CPU supports (the feature checks are
    /// cached by the standard library: a few loads per call).
    #[inline]
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                return if has!("avx512f") && has!("avx512vl") {
                    Self::Avx512
                } else {
                    Self::Avx2
                };
            }
        }
        Self::Base
    }
}
