//! The branch-free `exp` against the platform's `f64::exp` (glibc's is
//! correctly rounded in nearly every case, within 0.502 ulp): the error in
//! ulps of the exact result over every input whose result is a normal
//! number, sampled densely in bit space, plus the special values.

use ddmlip_float::{exp_f32, exp_f64, Real};

/// Size of one ulp of `f32` at the magnitude of `v` (a positive normal).
fn ulp_f32(v: f64) -> f64 {
    let e = v.log2().floor();
    2f64.powf(e - 23.0)
}

/// Size of one ulp of `f64` at the magnitude of `v` (a positive normal).
fn ulp_f64(v: f64) -> f64 {
    let bits = v.to_bits() & 0x7ff0_0000_0000_0000;
    f64::from_bits(bits) * f64::EPSILON
}

/// Every `step`-th bit pattern of `f32` values in `[lo, hi]` (both signs
/// walked from zero outwards, so tiny arguments are covered too).
fn f32_samples(lo: f32, hi: f32, step: u32) -> impl Iterator<Item = f32> {
    let pos = (0..hi.to_bits()).step_by(step as usize).map(f32::from_bits);
    let neg = (0..(-lo).to_bits())
        .step_by(step as usize)
        .map(|b| -f32::from_bits(b));
    pos.chain(neg).chain([lo, hi])
}

#[test]
fn exp_f32_is_within_one_ulp_where_normal() {
    // ln of the smallest normal and of the largest finite f32.
    let (lo, hi) = (-87.336_54_f32, 88.722_83_f32);
    let mut worst = (0.0f64, 0.0f32);
    let mut count = 0usize;
    for x in f32_samples(lo, hi, 701) {
        let exact = (x as f64).exp();
        let got = exp_f32(x) as f64;
        let err = (got - exact).abs() / ulp_f32(exact);
        if err > worst.0 {
            worst = (err, x);
        }
        count += 1;
    }
    assert!(count > 3_000_000, "{count} samples");
    println!(
        "f32: worst {:.3} ulp at x = {:e} ({count} samples)",
        worst.0, worst.1
    );
    assert!(worst.0 <= 1.0, "{:.3} ulp at x = {:e}", worst.0, worst.1);
}

#[test]
fn exp_f64_is_within_one_and_a_half_ulp_where_normal() {
    let (lo, hi) = (-708.39_f64, 709.78_f64);
    let mut worst = (0.0f64, 0.0f64);
    let mut max_rel = 0.0f64;
    let n = 4_000_000u64;
    // Uniform in value over the range, and dense near zero in bit space.
    let uniform = (0..=n).map(|k| lo + (hi - lo) * k as f64 / n as f64);
    let small = (0..2_000_000u64).map(|k| {
        let b = (k * 1_234_567_891) % 0x4000_0000_0000_0000; // |x| < 2
        if k % 2 == 0 {
            f64::from_bits(b)
        } else {
            -f64::from_bits(b)
        }
    });
    for x in uniform.chain(small) {
        let exact = x.exp();
        let got = exp_f64(x);
        let err = (got - exact).abs() / ulp_f64(exact);
        max_rel = max_rel.max((got - exact).abs() / exact);
        if err > worst.0 {
            worst = (err, x);
        }
    }
    println!(
        "f64: worst {:.3} ulp (relative {max_rel:.2e}) at x = {:e}",
        worst.0, worst.1
    );
    assert!(worst.0 <= 1.5, "{:.3} ulp at x = {:e}", worst.0, worst.1);
    assert!(max_rel < 3e-16, "relative error {max_rel:e}");
}

#[test]
fn exp_special_values_and_range_ends() {
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp_f64(0.0), 1.0);
    assert_eq!(exp_f32(-0.0), 1.0);
    assert!(exp_f32(f32::NAN).is_nan());
    assert!(exp_f64(f64::NAN).is_nan());
    assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_f64(f64::NEG_INFINITY), 0.0);
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_f64(f64::INFINITY), f64::INFINITY);
    // Past the largest finite result: ∞; far below the smallest subnormal: 0.
    assert_eq!(exp_f32(88.73), f32::INFINITY);
    assert_eq!(exp_f64(709.79), f64::INFINITY);
    assert_eq!(exp_f32(-200.0), 0.0);
    assert_eq!(exp_f64(-1000.0), 0.0);
    // Subnormal results underflow gradually, as the true value rounds.
    for x in [-90.0f32, -95.5, -100.0, -103.0] {
        let want = (x as f64).exp();
        let got = exp_f32(x) as f64;
        assert!(
            (got - want).abs() <= 2.0 * f32::from_bits(1) as f64,
            "{x}: {got:e} vs {want:e}"
        );
    }
    for x in [-710.0f64, -730.0, -744.0] {
        let want = x.exp();
        let got = exp_f64(x);
        assert!(
            (got - want).abs() <= 2.0 * f64::from_bits(1),
            "{x}: {got:e} vs {want:e}"
        );
    }
    // The trait method is the same function.
    assert_eq!(1.7f32.exp_branchless(), exp_f32(1.7));
    assert_eq!((-3.2f64).exp_branchless(), exp_f64(-3.2));
}
