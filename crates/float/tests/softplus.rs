//! The branch-free `softplus` against the platform's `ln_1p(exp(·))` in
//! `f64`: the error in ulps of the reference over inputs sampled densely in
//! bit space (both signs, tiny to beyond the overflow of `exp`), plus the
//! special values; and through the `Real` trait.

use ddmlip_float::{softplus_f32, softplus_f64, Real};

/// `ln(1 + eˣ)` from the platform's functions (each within about half an
/// ulp), in the stable form.
fn reference(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// Size of one ulp of `f64` at the magnitude of `v` (normal or subnormal).
fn ulp_f64(v: f64) -> f64 {
    let bits = v.abs().to_bits() & 0x7ff0_0000_0000_0000;
    if bits == 0 {
        f64::from_bits(1)
    } else {
        f64::from_bits(bits) * f64::EPSILON
    }
}

/// Size of one ulp of `f32` at the magnitude of `v`.
fn ulp_f32(v: f64) -> f64 {
    let e = (v.abs() as f32).to_bits() >> 23;
    if e == 0 {
        f64::from(f32::from_bits(1))
    } else {
        2f64.powi(e as i32 - 127 - 23)
    }
}

#[test]
fn softplus_f64_is_within_two_and_a_half_ulp_of_the_platform() {
    let mut worst = (0.0f64, 0.0f64);
    let mut count = 0usize;
    // Every 2³⁷-th bit pattern up to 1e4 in magnitude: about 1.2 million
    // arguments per sign, from subnormal upwards.
    let hi = 1e4f64.to_bits();
    for b in (0..hi).step_by(1 << 37) {
        for x in [f64::from_bits(b), -f64::from_bits(b)] {
            let (got, want) = (softplus_f64(x), reference(x));
            let err = (got - want).abs() / ulp_f64(want);
            count += 1;
            if err > worst.0 {
                worst = (err, x);
            }
        }
    }
    assert!(count > 2_000_000, "{count} samples");
    eprintln!(
        "softplus f64: worst {:.3} ulp at x = {:e} over {count} arguments",
        worst.0, worst.1
    );
    assert!(worst.0 <= 2.5, "{:.3} ulp at x = {:e}", worst.0, worst.1);
}

#[test]
fn softplus_f32_is_within_one_ulp() {
    let mut worst = (0.0f64, 0.0f32);
    let hi = 100f32.to_bits();
    for b in (0..hi).step_by(97) {
        for x in [f32::from_bits(b), -f32::from_bits(b)] {
            let want = reference(f64::from(x));
            let got = f64::from(softplus_f32(x));
            let err = (got - want).abs() / ulp_f32(want);
            if err > worst.0 {
                worst = (err, x);
            }
        }
    }
    eprintln!(
        "softplus f32: worst {:.3} ulp at x = {:e}",
        worst.0, worst.1
    );
    assert!(worst.0 <= 1.0, "{:.3} ulp at x = {:e}", worst.0, worst.1);
}

#[test]
fn special_values_and_the_trait() {
    assert!(softplus_f64(f64::NAN).is_nan() && softplus_f32(f32::NAN).is_nan());
    assert_eq!(softplus_f64(f64::INFINITY), f64::INFINITY);
    assert_eq!(softplus_f64(f64::NEG_INFINITY), 0.0);
    assert_eq!(softplus_f64(0.0), std::f64::consts::LN_2);
    assert_eq!(softplus_f64(1e300), 1e300);
    assert_eq!(softplus_f64(-1e300), 0.0);
    assert_eq!(softplus_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(softplus_f32(-200.0), 0.0);
    // Far below: e^x itself, down to the subnormals.
    let x = -720.0f64;
    assert_eq!(softplus_f64(x), reference(x));
    for x in [-3.5f64, 0.25, 17.0] {
        assert_eq!(Real::softplus_branchless(x), softplus_f64(x));
        let x32 = x as f32;
        assert_eq!(Real::softplus_branchless(x32), softplus_f32(x32));
    }
}
