//! Per-output comparison of a decomposed run with the reference, per row
//! (systems) or per global atom id (atoms).

use ddmlip_runtime::EvalResult;
use std::collections::BTreeMap;

/// Differences of every compared output.
#[derive(Debug, Clone, Default)]
pub(crate) struct Comparison {
    pub max_abs: BTreeMap<String, f64>,
    pub max_rel: BTreeMap<String, f64>,
    /// Least-squares scale `Σ d·r / Σ r²` of the decomposed values `d` onto
    /// the reference `r`: ≈ 1 when right, ≈ world size for an extra
    /// all-reduce, ≈ 2 for a double count.
    pub ratio: BTreeMap<String, f64>,
    pub passed: Vec<String>,
    pub failed: Vec<String>,
}

/// Compares every reference output whose name does not start with `_`.
///
/// Rows are matched by position (outputs are in batch / global-atom order).
/// `abs` is the largest |d − r|; `rel` is `abs / max_k |r_k|`, the error
/// relative to the output's largest magnitude, which stays meaningful where
/// single entries cross zero (force components). Entries NaN in both runs
/// (stress of a non-periodic system) are equal; NaN in one only is an
/// infinite difference. An output passes when `abs ≤ atol` or `rel ≤ rtol`.
pub(crate) fn compare(
    reference: &EvalResult,
    decomposed: &EvalResult,
    atol: f64,
    rtol: f64,
) -> Comparison {
    let mut c = Comparison::default();
    for (name, r) in &reference.outputs {
        if name.starts_with('_') {
            continue;
        }
        let (abs, rel, ratio) = match decomposed.outputs.get(name) {
            Some(d) if d.values.len() == r.values.len() => diff(&r.values, &d.values),
            _ => (f64::INFINITY, f64::INFINITY, f64::NAN),
        };
        c.max_abs.insert(name.clone(), abs);
        c.max_rel.insert(name.clone(), rel);
        c.ratio.insert(name.clone(), ratio);
        if abs <= atol || rel <= rtol {
            c.passed.push(name.clone());
        } else {
            c.failed.push(name.clone());
        }
    }
    c
}

/// How far `other` is from `reference`, entry by entry, as the
/// validation's comparison measures it: the largest |d − r|, that over the largest |r| (0 when
/// equal, ∞ for a NaN on one side only or a length mismatch), and the
/// least-squares scale of `other` onto `reference`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deviation {
    /// Largest absolute difference.
    pub abs: f64,
    /// `abs` relative to the largest |reference| entry.
    pub rel: f64,
    /// `Σ d·r / Σ r²` (NaN when the reference is all zero).
    pub ratio: f64,
}

impl Deviation {
    /// Whether it is within tolerance: `abs ≤ atol` or `rel ≤ rtol` (the
    /// validation's pass rule).
    pub fn within(&self, atol: f64, rtol: f64) -> bool {
        self.abs <= atol || self.rel <= rtol
    }
}

/// The [`Deviation`] of `other` from `reference` (matched by position).
pub fn deviation(reference: &[f64], other: &[f64]) -> Deviation {
    if reference.len() != other.len() {
        return Deviation {
            abs: f64::INFINITY,
            rel: f64::INFINITY,
            ratio: f64::NAN,
        };
    }
    let (abs, rel, ratio) = diff(reference, other);
    Deviation { abs, rel, ratio }
}

fn diff(r: &[f64], d: &[f64]) -> (f64, f64, f64) {
    let mut abs: f64 = 0.0;
    let mut scale: f64 = 0.0;
    let (mut dr, mut rr) = (0.0, 0.0);
    for (&a, &b) in r.iter().zip(d) {
        match (a.is_nan(), b.is_nan()) {
            (true, true) => continue,
            (false, false) => {
                let e = (a - b).abs();
                // `max` ignores NaN; an infinite pair difference stays infinite.
                abs = if e.is_nan() {
                    f64::INFINITY
                } else {
                    abs.max(e)
                };
                scale = scale.max(a.abs());
                dr += a * b;
                rr += a * a;
            }
            _ => abs = f64::INFINITY,
        }
    }
    let rel = if abs == 0.0 {
        0.0
    } else if scale > 0.0 {
        abs / scale
    } else {
        f64::INFINITY
    };
    let ratio = if rr > 0.0 { dr / rr } else { f64::NAN };
    (abs, rel, ratio)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddmlip_runtime::OutputData;
    use ddmlip_spec::OutputKind;

    fn result(name: &str, values: Vec<f64>) -> EvalResult {
        let mut r = EvalResult::default();
        r.outputs.insert(
            name.into(),
            OutputData {
                kind: OutputKind::PerSystem,
                width: 1,
                values,
            },
        );
        r
    }

    #[test]
    fn metrics_match_hand_computation() {
        let r = result("energy", vec![2.0, -4.0, f64::NAN]);
        let d = result("energy", vec![2.5, -4.0, f64::NAN]);
        let c = compare(&r, &d, 1e-8, 1e-10);
        assert_eq!(c.max_abs["energy"], 0.5);
        assert_eq!(c.max_rel["energy"], 0.5 / 4.0);
        // (2·2.5 + 16) / (4 + 16)
        assert!((c.ratio["energy"] - 21.0 / 20.0).abs() < 1e-15);
        assert_eq!(c.failed, vec!["energy".to_string()]);
        let c = compare(&r, &d, 1.0, 1e-10);
        assert_eq!(c.passed, vec!["energy".to_string()]);
    }

    #[test]
    fn nan_on_one_side_or_missing_output_fails() {
        let r = result("x", vec![1.0]);
        let d = result("x", vec![f64::NAN]);
        assert!(compare(&r, &d, 1.0, 1.0).failed.contains(&"x".to_string()));
        let d = result("y", vec![1.0]);
        let c = compare(&r, &d, 1.0, 1.0);
        assert!(c.max_abs["x"].is_infinite());
        let hidden = result("_counts", vec![1.0]);
        assert!(compare(&hidden, &d, 0.0, 0.0).max_abs.is_empty());
    }

    #[test]
    fn ratio_detects_world_size_blow_up() {
        let r = result("energy", vec![-3.0, -5.0]);
        let d = result("energy", vec![-12.0, -20.0]);
        assert!((compare(&r, &d, 0.0, 0.0).ratio["energy"] - 4.0).abs() < 1e-14);
    }
}
