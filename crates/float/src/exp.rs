//! `exp` without branches or library calls, so that a loop applying it to a
//! slice compiles to vector instructions (the SiLU of the radial MLPs calls
//! it tens of thousands of times per atom). Cody–Waite range reduction
//! `x = n·ln 2 + r`, |r| ≤ ln 2 / 2, a polynomial for `exp(r)`, and the
//! scale `2ⁿ` built from exponent bits in two halves (so that results down
//! to the subnormal range and up to overflow need no special case).
//!
//! Accuracy over the whole range where the result is a normal number
//! (`tests/exp.rs`, against `f64::exp` on millions of arguments): `f32`
//! within 1 ulp (0.93 measured), `f64` within 1.5 ulp (1.0 measured,
//! relative error 2.2e-16). NaN gives NaN, −∞ gives 0, +∞ gives +∞;
//! results below the subnormal range are 0 and above the largest finite
//! value +∞, as for `exp`.

/// 1.5·2²³: adding it rounds an `f32` of magnitude below 2²² to an integer
/// (round to nearest even), which then sits in the low mantissa bits.
const ROUND_F32: f32 = 12_582_912.0;
/// 1.5·2⁵²: the same for `f64`.
const ROUND_F64: f64 = 6_755_399_441_055_744.0;

/// `2^n` for `n` in −252..=254 as the product of two normal powers of two
/// `2^(n/2)·2^(n − n/2)`, so that `p·2^n` underflows gradually and
/// overflows to ∞ exactly as the true product would.
#[inline(always)]
fn scale_f32(p: f32, n: i32) -> f32 {
    let n1 = n >> 1;
    let n2 = n.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32).wrapping_shl(23));
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32).wrapping_shl(23));
    p * s1 * s2
}

/// `2^n` scaling for `f64`, as [`scale_f32`] (n in −2044..=2046).
#[inline(always)]
fn scale_f64(p: f64, n: i64) -> f64 {
    let n1 = n >> 1;
    let n2 = n.wrapping_sub(n1);
    let s1 = f64::from_bits((n1.wrapping_add(1023) as u64).wrapping_shl(52));
    let s2 = f64::from_bits((n2.wrapping_add(1023) as u64).wrapping_shl(52));
    p * s1 * s2
}

/// `eˣ` in `f32` (see the module documentation for the error bound).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // Outside [-104, 89] the result is 0 or ∞ in f32; clamping keeps n
    // inside scale_f32's range (`clamp` keeps NaN).
    let x = x.clamp(-104.0, 89.0);
    let t = x * std::f32::consts::LOG2_E + ROUND_F32;
    let n = (t.to_bits() as i32).wrapping_sub(ROUND_F32.to_bits() as i32);
    let nf = t - ROUND_F32;
    // ln 2 = LN2_HI + LN2_LO, LN2_HI with 9 significant bits so that
    // nf·LN2_HI is exact for |n| < 2¹⁵.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let r = (x - nf * LN2_HI) - nf * LN2_LO;
    // Minimax polynomial of Cephes' `expf` for (eʳ − 1 − r)/r² on |r| ≤ ln 2 / 2.
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = (p * (r * r) + r) + 1.0;
    scale_f32(e, n)
}

/// `eˣ` in `f64` (see the module documentation for the error bound).
#[inline(always)]
pub fn exp_f64(x: f64) -> f64 {
    // Outside [-746, 710] the result is 0 or ∞ in f64.
    let x = x.clamp(-746.0, 710.0);
    let t = x * std::f64::consts::LOG2_E + ROUND_F64;
    let n = (t.to_bits() as i64).wrapping_sub(ROUND_F64.to_bits() as i64);
    let nf = t - ROUND_F64;
    // fdlibm's split of ln 2: LN2_HI has 32 significant bits, so nf·LN2_HI
    // is exact for |n| < 2²⁰.
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    let r = (x - nf * LN2_HI) - nf * LN2_LO;
    // Taylor series of (eʳ − 1 − r)/r² to r¹¹ (truncation below 5e-18
    // relative on |r| ≤ ln 2 / 2).
    const C: [f64; 11] = [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        1.0 / 2.0,
    ];
    let mut p = 1.0 / 6_227_020_800.0;
    for c in C {
        p = p * r + c;
    }
    let e = (p * (r * r) + r) + 1.0;
    scale_f64(e, n)
}
