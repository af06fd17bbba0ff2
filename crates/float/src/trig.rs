//! `sin` and `cos` of `f64` slices without library calls, so that the loop
//! compiles to vector instructions (NequIP's Bessel basis takes the sine of
//! every edge's eight radial arguments, and its gradient the cosine).
//!
//! Cody–Waite reduction `x = k·π/2 + r`, |r| ≤ π/4, with π/2 split in
//! three parts (fdlibm's, 33 + 33 + 53 bits: `k·part` is exact for
//! |k| < 2²⁰), fdlibm's minimax polynomials for sin and cos on
//! [−π/4, π/4], and the quadrant `k mod 4` choosing and signing the two.
//! Arguments beyond [`SIN_COS_REDUCED_MAX`] in magnitude (and NaN, ±∞)
//! take the standard library's `sin_cos` instead, element by element.
//!
//! Accuracy (`tests/trig.rs`, against `f64::sin_cos` over millions of
//! arguments up to 10⁶ and next to multiples of π/2): within 2 ulp of the
//! result (2 measured), near the zeros of sin and cos included.

use crate::Isa;

/// Largest |x| the reduction handles (2¹⁹·π: `k` stays below 2²⁰).
pub const SIN_COS_REDUCED_MAX: f64 = 1_647_099.0;

/// 1.5·2⁵²: adding it rounds an `f64` of magnitude below 2⁵¹ to an integer.
const ROUND_F64: f64 = 6_755_399_441_055_744.0;

/// (sin x, cos x) for |x| ≤ [`SIN_COS_REDUCED_MAX`] (garbage beyond it).
#[inline(always)]
fn sin_cos_reduced(x: f64) -> (f64, f64) {
    const PIO2_1: f64 = 1.570_796_326_734_125_6e0;
    const PIO2_2: f64 = 6.077_100_506_303_966e-11;
    const PIO2_3: f64 = 2.022_266_248_795_950_6e-21;
    let t = x * std::f64::consts::FRAC_2_PI + ROUND_F64;
    let k = (t.to_bits() as i64).wrapping_sub(ROUND_F64.to_bits() as i64);
    let kf = t - ROUND_F64;
    let r = ((x - kf * PIO2_1) - kf * PIO2_2) - kf * PIO2_3;
    let z = r * r;
    // fdlibm __kernel_sin: sin r = r + r³·(S1 + z·p(z)).
    const S1: f64 = -1.666_666_666_666_663_2e-1;
    const S2: f64 = 8.333_333_333_322_49e-3;
    const S3: f64 = -1.984_126_982_985_795e-4;
    const S4: f64 = 2.755_731_370_707_006_8e-6;
    const S5: f64 = -2.505_076_025_340_686_3e-8;
    const S6: f64 = 1.589_690_995_211_55e-10;
    let ps = S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)));
    let s = r + (z * r) * (S1 + z * ps);
    // fdlibm __kernel_cos: cos r = 1 − z/2 + z²·q(z), the 1 − z/2 split so
    // that its rounding error is recovered.
    const C1: f64 = 4.166_666_666_666_66e-2;
    const C2: f64 = -1.388_888_888_887_411e-3;
    const C3: f64 = 2.480_158_728_947_673e-5;
    const C4: f64 = -2.755_731_435_139_066_3e-7;
    const C5: f64 = 2.087_572_321_298_175e-9;
    const C6: f64 = -1.135_964_755_778_819_5e-11;
    let pc = z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))));
    let hz = 0.5 * z;
    let w = 1.0 - hz;
    let c = w + (((1.0 - w) - hz) + z * pc);
    // Quadrant k mod 4: (sin, cos) = (s, c), (c, −s), (−s, −c), (−c, s).
    let q = k as u64;
    let odd = q & 1 == 1;
    let (sin, cos) = if odd { (c, s) } else { (s, c) };
    let sin = f64::from_bits(sin.to_bits() ^ ((q & 2) << 62));
    let cos = f64::from_bits(cos.to_bits() ^ ((q.wrapping_add(1) & 2) << 62));
    (sin, cos)
}

/// The loop every instruction-set copy compiles.
#[inline(always)]
fn sin_cos_loop(x: &[f64], sin: &mut [f64], cos: &mut [f64]) {
    for ((&xi, s), c) in x.iter().zip(sin.iter_mut()).zip(cos.iter_mut()) {
        (*s, *c) = sin_cos_reduced(xi);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq")]
unsafe fn sin_cos_avx512(x: &[f64], sin: &mut [f64], cos: &mut [f64]) {
    sin_cos_loop(x, sin, cos)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sin_cos_avx2(x: &[f64], sin: &mut [f64], cos: &mut [f64]) {
    sin_cos_loop(x, sin, cos)
}

/// `sin[i], cos[i] = sin x[i], cos x[i]` over the shortest of the three
/// slices, in vector instructions where the CPU has them.
pub fn sin_cos_slice(x: &[f64], sin: &mut [f64], cos: &mut [f64]) {
    let n = x.len().min(sin.len()).min(cos.len());
    let (x, sin, cos) = (&x[..n], &mut sin[..n], &mut cos[..n]);
    match Isa::detect() {
        // SAFETY: detect() returns Avx512 only when the CPU has AVX-512 F
        // and VL, AVX2 and FMA; DQ (64-bit integer conversions) ships with
        // every AVX-512 CPU that has VL.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if std::arch::is_x86_feature_detected!("avx512dq") => unsafe {
            sin_cos_avx512(x, sin, cos)
        },
        // SAFETY: detect() returns Avx2 (or Avx512) only when the CPU has
        // AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx2 => unsafe { sin_cos_avx2(x, sin, cos) },
        _ => sin_cos_loop(x, sin, cos),
    }
    // Arguments the reduction does not cover (rare): the library's.
    for ((&xi, s), c) in x.iter().zip(sin.iter_mut()).zip(cos.iter_mut()) {
        if xi.is_nan() || xi.abs() > SIN_COS_REDUCED_MAX {
            (*s, *c) = xi.sin_cos();
        }
    }
}
