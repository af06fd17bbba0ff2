//! e3nn's real Clebsch–Gordan tensors (`e3nn.o3.wigner_3j`, e3nn ≥ 0.5).
//!
//! Built exactly like e3nn: complex SU(2) Clebsch–Gordan coefficients
//! (Racah formula), changed to the real basis with e3nn's `Q_l` matrices
//! (including the `(−i)^l` factor), then normalised to unit Frobenius norm.
//! The sign convention matters: trained weights were fitted against it.

use crate::error::E3nnError;

/// Largest degree supported by [`wigner_3j`].
pub const WIGNER_LMAX: usize = 3;

#[derive(Clone, Copy, Debug, Default)]
struct Complex {
    re: f64,
    im: f64,
}

impl Complex {
    fn mul(self, o: Complex) -> Complex {
        Complex {
            re: self.re * o.re - self.im * o.im,
            im: self.re * o.im + self.im * o.re,
        }
    }
    fn conj(self) -> Complex {
        Complex {
            re: self.re,
            im: -self.im,
        }
    }
}

fn factorial(n: i64) -> f64 {
    (1..=n).map(|v| v as f64).product()
}

/// ⟨l1 m1; l2 m2 | l3 m3⟩ (Condon–Shortley), the Racah formula as e3nn
/// copied it from QuTiP.
fn su2_cg(l1: i64, m1: i64, l2: i64, m2: i64, l3: i64, m3: i64) -> f64 {
    if m3 != m1 + m2 {
        return 0.0;
    }
    let vmin = (-l1 + l2 + m3).max(-l1 + m1).max(0);
    let vmax = (l2 + l3 + m1).min(l3 - l1 + l2).min(l3 + m3);
    let f = factorial;
    let c = ((2 * l3 + 1) as f64
        * (f(l3 + l1 - l2) * f(l3 - l1 + l2) * f(l1 + l2 - l3) * f(l3 + m3) * f(l3 - m3))
        / (f(l1 + l2 + l3 + 1) * f(l1 - m1) * f(l1 + m1) * f(l2 - m2) * f(l2 + m2)))
    .sqrt();
    let mut s = 0.0;
    for v in vmin..=vmax {
        let sign = if (v + l2 + m2).rem_euclid(2) == 0 {
            1.0
        } else {
            -1.0
        };
        s += sign * (f(l2 + l3 + m1 - v) * f(l1 - m1 + v))
            / (f(v) * f(l3 - l1 + l2 - v) * f(l3 + m3 - v) * f(v + l1 - l2 - m3));
    }
    c * s
}

/// e3nn's `change_basis_real_to_complex(l)`: row index l+m, column the real
/// component, times (−i)^l.
fn real_to_complex(l: i64) -> Vec<Complex> {
    let d = (2 * l + 1) as usize;
    let mut q = vec![Complex::default(); d * d];
    let h = std::f64::consts::FRAC_1_SQRT_2;
    let idx = |r: i64, c: i64| (r as usize) * d + c as usize;
    for m in -l..0 {
        q[idx(l + m, l + m.abs())] = Complex { re: h, im: 0.0 };
        q[idx(l + m, l - m.abs())] = Complex { re: 0.0, im: -h };
    }
    q[idx(l, l)] = Complex { re: 1.0, im: 0.0 };
    for m in 1..=l {
        let sign = if m % 2 == 0 { 1.0 } else { -1.0 };
        q[idx(l + m, l + m)] = Complex {
            re: sign * h,
            im: 0.0,
        };
        q[idx(l + m, l - m)] = Complex {
            re: 0.0,
            im: sign * h,
        };
    }
    let phase = match l.rem_euclid(4) {
        0 => Complex { re: 1.0, im: 0.0 },
        1 => Complex { re: 0.0, im: -1.0 },
        2 => Complex { re: -1.0, im: 0.0 },
        _ => Complex { re: 0.0, im: 1.0 },
    };
    q.iter().map(|&v| phase.mul(v)).collect()
}

/// The real Clebsch–Gordan tensor `C[a, b, c]` of e3nn, shape
/// `(2l1+1, 2l2+1, 2l3+1)` row-major, unit Frobenius norm.
///
/// Requires `|l1 − l2| ≤ l3 ≤ l1 + l2` and every `l ≤ 3`.
pub fn wigner_3j(l1: usize, l2: usize, l3: usize) -> Result<Vec<f64>, E3nnError> {
    if l1.max(l2).max(l3) > WIGNER_LMAX {
        return Err(E3nnError::Unsupported(format!(
            "wigner_3j({l1},{l2},{l3}): degrees above {WIGNER_LMAX}"
        )));
    }
    if l3 < l1.abs_diff(l2) || l3 > l1 + l2 {
        return Err(E3nnError::Config(format!(
            "wigner_3j({l1},{l2},{l3}) violates the triangle inequality"
        )));
    }
    let (l1, l2, l3) = (l1 as i64, l2 as i64, l3 as i64);
    let (d1, d2, d3) = (
        (2 * l1 + 1) as usize,
        (2 * l2 + 1) as usize,
        (2 * l3 + 1) as usize,
    );
    let (q1, q2, q3) = (
        real_to_complex(l1),
        real_to_complex(l2),
        real_to_complex(l3),
    );
    let mut out_c = vec![Complex::default(); d1 * d2 * d3];
    for i in 0..d1 {
        for k in 0..d2 {
            let m1 = i as i64 - l1;
            let m2 = k as i64 - l2;
            let m3 = m1 + m2;
            if m3.abs() > l3 {
                continue;
            }
            let n = (m3 + l3) as usize;
            let s = su2_cg(l1, m1, l2, m2, l3, m3);
            if s == 0.0 {
                continue;
            }
            for a in 0..d1 {
                let qa = q1[i * d1 + a];
                for b in 0..d2 {
                    let qab = qa.mul(q2[k * d2 + b]);
                    for c in 0..d3 {
                        let v = qab.mul(q3[n * d3 + c].conj());
                        let o = &mut out_c[(a * d2 + b) * d3 + c];
                        o.re += s * v.re;
                        o.im += s * v.im;
                    }
                }
            }
        }
    }
    let mut out: Vec<f64> = out_c.iter().map(|v| v.re).collect();
    let norm = out.iter().map(|v| v * v).sum::<f64>().sqrt();
    for v in &mut out {
        *v /= norm;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: f64 = 1e-11;

    fn nonzeros(c: &[f64], d2: usize, d3: usize) -> Vec<((usize, usize, usize), f64)> {
        c.iter()
            .enumerate()
            .filter(|(_, v)| v.abs() > 1e-12)
            .map(|(i, &v)| ((i / (d2 * d3), (i / d3) % d2, i % d3), v))
            .collect()
    }

    fn check_prefix(
        l: (usize, usize, usize),
        expect: &[((usize, usize, usize), f64)],
        count: usize,
        sum: f64,
    ) {
        let c = wigner_3j(l.0, l.1, l.2).unwrap();
        let nz = nonzeros(&c, 2 * l.1 + 1, 2 * l.2 + 1);
        assert_eq!(nz.len(), count, "nonzero count of {l:?}");
        for (got, want) in nz.iter().zip(expect) {
            assert_eq!(got.0, want.0, "index in {l:?}");
            assert!(
                (got.1 - want.1).abs() < TOL,
                "{l:?} {:?}: {} vs {}",
                got.0,
                got.1,
                want.1
            );
        }
        let s: f64 = c.iter().sum();
        assert!((s - sum).abs() < 1e-10, "sum of {l:?}: {s} vs {sum}");
    }

    #[test]
    fn deltas_are_positive_and_normalised() {
        let c110 = wigner_3j(1, 1, 0).unwrap();
        let c011 = wigner_3j(0, 1, 1).unwrap();
        let c101 = wigner_3j(1, 0, 1).unwrap();
        let c220 = wigner_3j(2, 2, 0).unwrap();
        for a in 0..3 {
            for b in 0..3 {
                let d = if a == b { 1.0 / 3f64.sqrt() } else { 0.0 };
                assert!((c110[a * 3 + b] - d).abs() < TOL);
                assert!((c011[a * 3 + b] - d).abs() < TOL);
                assert!((c101[a * 3 + b] - d).abs() < TOL);
            }
        }
        for a in 0..5 {
            for b in 0..5 {
                let d = if a == b { 1.0 / 5f64.sqrt() } else { 0.0 };
                assert!((c220[a * 5 + b] - d).abs() < TOL);
            }
        }
    }

    #[test]
    fn c111_is_levi_civita() {
        let c = wigner_3j(1, 1, 1).unwrap();
        let eps = |a: usize, b: usize, k: usize| -> f64 {
            match (a, b, k) {
                (0, 1, 2) | (1, 2, 0) | (2, 0, 1) => 1.0,
                (0, 2, 1) | (2, 1, 0) | (1, 0, 2) => -1.0,
                _ => 0.0,
            }
        };
        for a in 0..3 {
            for b in 0..3 {
                for k in 0..3 {
                    let want = eps(a, b, k) / 6f64.sqrt();
                    assert!((c[(a * 3 + b) * 3 + k] - want).abs() < TOL);
                }
            }
        }
        assert!((c[5] - 0.408248290464).abs() < 1e-12);
    }

    #[test]
    fn c112_all_entries() {
        let expect = [
            ((0, 0, 2), -0.182574185835),
            ((0, 0, 4), -0.316227766017),
            ((0, 1, 1), 0.316227766017),
            ((0, 2, 0), 0.316227766017),
            ((1, 0, 1), 0.316227766017),
            ((1, 1, 2), 0.365148371670),
            ((1, 2, 3), 0.316227766017),
            ((2, 0, 0), 0.316227766017),
            ((2, 1, 3), 0.316227766017),
            ((2, 2, 2), -0.182574185835),
            ((2, 2, 4), 0.316227766017),
        ];
        check_prefix((1, 1, 2), &expect, 11, 1.897366596101);
    }

    #[test]
    fn listed_prefixes() {
        check_prefix(
            (1, 2, 1),
            &[
                ((0, 0, 2), 0.316227766017),
                ((0, 1, 1), 0.316227766017),
                ((0, 2, 0), -0.182574185835),
                ((0, 4, 0), -0.316227766017),
            ],
            11,
            1.897366596101,
        );
        check_prefix(
            (1, 2, 2),
            &[
                ((0, 0, 1), -0.182574185835),
                ((0, 1, 0), 0.182574185835),
                ((0, 2, 3), 0.316227766017),
                ((0, 3, 2), -0.316227766017),
            ],
            16,
            0.0,
        );
        check_prefix(
            (2, 1, 1),
            &[
                ((0, 0, 2), 0.316227766017),
                ((0, 2, 0), 0.316227766017),
                ((1, 0, 1), 0.316227766017),
            ],
            11,
            1.897366596101,
        );
        check_prefix(
            (2, 1, 2),
            &[
                ((0, 0, 1), 0.182574185835),
                ((0, 1, 4), 0.365148371670),
                ((0, 2, 3), -0.182574185835),
            ],
            16,
            0.0,
        );
        check_prefix(
            (2, 2, 1),
            &[
                ((0, 1, 0), -0.182574185835),
                ((0, 3, 2), 0.182574185835),
                ((0, 4, 1), -0.365148371670),
            ],
            16,
            0.0,
        );
        check_prefix(
            (2, 2, 2),
            &[
                ((0, 0, 2), -0.239045721867),
                ((0, 1, 3), 0.207019667803),
                ((0, 2, 0), -0.239045721867),
                ((0, 3, 1), 0.207019667803),
            ],
            25,
            0.764026563082,
        );
    }

    #[test]
    fn unit_norm_and_l3_supported() {
        for l1 in 0..=3usize {
            for l2 in 0..=3usize {
                for l3 in l1.abs_diff(l2)..=(l1 + l2).min(3) {
                    let c = wigner_3j(l1, l2, l3).unwrap();
                    let n: f64 = c.iter().map(|v| v * v).sum();
                    assert!((n - 1.0).abs() < 1e-12);
                }
            }
        }
        assert!(wigner_3j(1, 1, 3).is_err());
        assert!(wigner_3j(4, 0, 4).is_err());
    }
}
