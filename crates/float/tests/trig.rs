//! The vectorised `sin`/`cos` against the platform's `f64::sin_cos`
//! (glibc's are correctly rounded in nearly every case): the error in ulps
//! of the reference over arguments sampled densely in bit space up to 10⁶,
//! next to multiples of π/2 (where the reduction cancels), and the special
//! values the library handles.

use ddmlip_float::{sin_cos_slice, SIN_COS_REDUCED_MAX};

/// Size of one ulp of `f64` at the magnitude of `v` (normal or not).
fn ulp_f64(v: f64) -> f64 {
    let bits = v.abs().to_bits() & 0x7ff0_0000_0000_0000;
    f64::from_bits(bits).max(f64::MIN_POSITIVE) * f64::EPSILON
}

/// Worst error in ulps of the reference over `x`, for sin and for cos.
fn worst_ulps(x: &[f64]) -> (f64, f64) {
    let mut s = vec![0.0; x.len()];
    let mut c = vec![0.0; x.len()];
    sin_cos_slice(x, &mut s, &mut c);
    let mut worst = (0.0f64, 0.0f64);
    for ((&xi, &si), &ci) in x.iter().zip(&s).zip(&c) {
        let (rs, rc) = xi.sin_cos();
        worst.0 = worst.0.max((si - rs).abs() / ulp_f64(rs));
        worst.1 = worst.1.max((ci - rc).abs() / ulp_f64(rc));
    }
    worst
}

#[test]
fn sin_cos_are_within_two_ulp_up_to_a_million() {
    // Every 2⁴⁰-th bit pattern from 0 to 10⁶ (about 8.5 million arguments,
    // tiny ones included), both signs.
    let hi = 1.0e6f64.to_bits();
    let x: Vec<f64> = (0..hi)
        .step_by(1 << 40)
        .map(f64::from_bits)
        .flat_map(|v| [v, -v])
        .collect();
    assert!(x.len() > 8_000_000);
    let (s, c) = worst_ulps(&x);
    eprintln!("worst: sin {s} ulp, cos {c} ulp");
    assert!(s <= 2.0 && c <= 2.0, "worst sin {s} ulp, cos {c} ulp");
}

#[test]
fn sin_cos_are_within_two_ulp_next_to_multiples_of_half_pi() {
    // The doubles nearest k·π/2 and a few neighbours: the reduction leaves
    // a tiny remainder there, whose every bit must be right.
    let mut x = Vec::new();
    for k in (1..20_000i64).chain((0..200).map(|j| 1_000_000 + j * 997)) {
        let v = k as f64 * std::f64::consts::FRAC_PI_2;
        for b in v.to_bits() - 3..=v.to_bits() + 3 {
            x.push(f64::from_bits(b));
            x.push(-f64::from_bits(b));
        }
    }
    let (s, c) = worst_ulps(&x);
    eprintln!("worst next to k·π/2: sin {s} ulp, cos {c} ulp");
    assert!(s <= 2.0 && c <= 2.0, "worst sin {s} ulp, cos {c} ulp");
}

#[test]
fn arguments_beyond_the_reduction_and_special_values_take_the_library_path() {
    let x = [
        0.0,
        -0.0,
        SIN_COS_REDUCED_MAX,
        SIN_COS_REDUCED_MAX * 1.5,
        -3.0e15,
        1.0e300,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let mut s = vec![0.0; x.len()];
    let mut c = vec![0.0; x.len()];
    sin_cos_slice(&x, &mut s, &mut c);
    for ((&xi, &si), &ci) in x.iter().zip(&s).zip(&c) {
        let (rs, rc) = xi.sin_cos();
        if xi.is_finite() && xi.abs() > SIN_COS_REDUCED_MAX {
            assert_eq!(
                (si.to_bits(), ci.to_bits()),
                (rs.to_bits(), rc.to_bits()),
                "at {xi}"
            );
        } else if xi.is_finite() {
            assert!(
                (si - rs).abs() <= 2.0 * ulp_f64(rs),
                "sin {xi}: {si} vs {rs}"
            );
            assert!(
                (ci - rc).abs() <= 2.0 * ulp_f64(rc),
                "cos {xi}: {ci} vs {rc}"
            );
        } else {
            assert!(si.is_nan() && ci.is_nan(), "at {xi}: {si}, {ci}");
        }
    }
}

#[test]
fn the_shortest_slice_sets_the_length() {
    let x = [0.5, 1.0, 1.5];
    let mut s = [9.0; 2];
    let mut c = [9.0; 4];
    sin_cos_slice(&x, &mut s, &mut c);
    assert_eq!(s, [0.5f64.sin(), 1.0f64.sin()]);
    assert_eq!(c[2..], [9.0, 9.0]);
}
