//! Real spherical harmonics of e3nn (`component` normalisation, normalised
//! input), degrees 0..=3, with their gradient w.r.t. the input vector.
//!
//! Layout per vector: `[Y0 | Y1 (3) | Y2 (5) | Y3 (7)]`, i.e. degree l starts
//! at column l². On the unit sphere |Y_l|² = 2l+1. The input is divided by
//! `max(|v|, 1e-12)`, so a zero vector maps to (1, 0, …).

use crate::error::{check_len, E3nnError};
use crate::real::Real;
use rayon::prelude::*;

/// Highest degree the kernels implement.
pub const SH_LMAX: usize = 3;

/// Number of SH components up to `lmax`: `(lmax+1)²`.
pub fn sh_dim(lmax: usize) -> usize {
    (lmax + 1) * (lmax + 1)
}

const NORM_EPS: f64 = 1e-12;

/// Y_l(u) for a unit vector `u`, written into `out[0..sh_dim(lmax)]`.
#[inline]
fn sh_unit<T: Real>(u: [T; 3], lmax: usize, out: &mut [T]) {
    let c = T::from_f64;
    let [x, y, z] = u;
    out[0] = T::ONE;
    if lmax == 0 {
        return;
    }
    let s3 = c(3f64.sqrt());
    out[1] = s3 * x;
    out[2] = s3 * y;
    out[3] = s3 * z;
    if lmax == 1 {
        return;
    }
    // e3nn builds l = 2 and 3 from these un-normalised pieces, then scales
    // degree l by √(2l+1).
    let sh20 = s3 * x * z;
    let sh21 = s3 * x * y;
    let y2 = y * y;
    let x2z2 = x * x + z * z;
    let sh22 = y2 - c(0.5) * x2z2;
    let sh23 = s3 * y * z;
    let sh24 = c(3f64.sqrt() / 2.0) * (z * z - x * x);
    let s5 = c(5f64.sqrt());
    out[4] = s5 * sh20;
    out[5] = s5 * sh21;
    out[6] = s5 * sh22;
    out[7] = s5 * sh23;
    out[8] = s5 * sh24;
    if lmax == 2 {
        return;
    }
    // e3nn's l = 3 recursion uses the component-normalised l = 2 terms.
    let (sh20, sh24) = (s5 * sh20, s5 * sh24);
    let a0 = c(42f64.sqrt() / 6.0);
    let a1 = c(7f64.sqrt());
    let a2 = c(168f64.sqrt() / 8.0);
    let a3 = c(7f64.sqrt() / 2.0);
    out[9] = a0 * (sh20 * z + sh24 * x);
    out[10] = a1 * sh20 * y;
    out[11] = a2 * (c(4.0) * y2 - x2z2) * x;
    out[12] = a3 * y * (c(2.0) * y2 - c(3.0) * x2z2);
    out[13] = a2 * z * (c(4.0) * y2 - x2z2);
    out[14] = a1 * sh24 * y;
    out[15] = a0 * (sh24 * z - sh20 * x);
}

/// Σ_c g[c]·∂Y_c/∂u for a unit vector `u` (u treated as a free variable).
#[inline]
fn sh_unit_vjp<T: Real>(u: [T; 3], lmax: usize, g: &[T]) -> [T; 3] {
    let c = T::from_f64;
    let [x, y, z] = u;
    let mut r = [T::ZERO; 3];
    if lmax == 0 {
        return r;
    }
    let s3 = c(3f64.sqrt());
    r[0] += s3 * g[1];
    r[1] += s3 * g[2];
    r[2] += s3 * g[3];
    if lmax == 1 {
        return r;
    }
    let s5 = s3 * c(5f64.sqrt() / 3f64.sqrt());
    // Gradients of the un-normalised l = 2 pieces.
    let d20 = [s3 * z, T::ZERO, s3 * x];
    let d21 = [s3 * y, s3 * x, T::ZERO];
    let d22 = [-x, c(2.0) * y, -z];
    let d23 = [T::ZERO, s3 * z, s3 * y];
    let d24 = [-s3 * x, T::ZERO, s3 * z];
    for k in 0..3 {
        r[k] +=
            s5 * (g[4] * d20[k] + g[5] * d21[k] + g[6] * d22[k] + g[7] * d23[k] + g[8] * d24[k]);
    }
    if lmax == 2 {
        return r;
    }
    // Component-normalised l = 2 pieces the l = 3 recursion is built from.
    let s15 = c(15f64.sqrt());
    let sh20 = s15 * x * z;
    let sh24 = c(15f64.sqrt() / 2.0) * (z * z - x * x);
    let d20 = [s15 * z, T::ZERO, s15 * x];
    let d24 = [-s15 * x, T::ZERO, s15 * z];
    let y2 = y * y;
    let x2z2 = x * x + z * z;
    let a0 = c(42f64.sqrt() / 6.0);
    let a1 = c(7f64.sqrt());
    let a2 = c(168f64.sqrt() / 8.0);
    let a3 = c(7f64.sqrt() / 2.0);
    let p = c(4.0) * y2 - x2z2;
    let two = c(2.0);
    let d30 = [
        a0 * (z * d20[0] + x * d24[0] + sh24),
        T::ZERO,
        a0 * (z * d20[2] + sh20 + x * d24[2]),
    ];
    let d31 = [a1 * y * d20[0], a1 * sh20, a1 * y * d20[2]];
    let d32 = [
        a2 * (p - two * x * x),
        a2 * c(8.0) * y * x,
        a2 * (-two * z * x),
    ];
    let d33 = [
        a3 * y * (-c(6.0) * x),
        a3 * (c(6.0) * y2 - c(3.0) * x2z2),
        a3 * y * (-c(6.0) * z),
    ];
    let d34 = [
        a2 * z * (-two * x),
        a2 * z * c(8.0) * y,
        a2 * (p - two * z * z),
    ];
    let d35 = [a1 * y * d24[0], a1 * sh24, a1 * y * d24[2]];
    let d36 = [
        a0 * (z * d24[0] - x * d20[0] - sh20),
        T::ZERO,
        a0 * (z * d24[2] + sh24 - x * d20[2]),
    ];
    for k in 0..3 {
        r[k] += g[9] * d30[k]
            + g[10] * d31[k]
            + g[11] * d32[k]
            + g[12] * d33[k]
            + g[13] * d34[k]
            + g[14] * d35[k]
            + g[15] * d36[k];
    }
    r
}

#[inline]
fn normalise<T: Real>(v: [T; 3]) -> ([T; 3], T, bool) {
    let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
    let eps = T::from_f64(NORM_EPS);
    let (d, clamped) = if n > eps { (n, false) } else { (eps, true) };
    ([v[0] / d, v[1] / d, v[2] / d], d, clamped)
}

fn check_lmax(lmax: usize) -> Result<(), E3nnError> {
    if lmax > SH_LMAX {
        return Err(E3nnError::Unsupported(format!(
            "spherical harmonics of degree {lmax} (max {SH_LMAX})"
        )));
    }
    Ok(())
}

/// Spherical harmonics of every vector: `out` is `E × sh_dim(lmax)` row-major.
pub fn sh_forward<T: Real>(
    vectors: &[[T; 3]],
    lmax: usize,
    out: &mut [T],
) -> Result<(), E3nnError> {
    check_lmax(lmax)?;
    let d = sh_dim(lmax);
    check_len("sh_forward out", vectors.len() * d, out.len())?;
    out.par_chunks_mut(d)
        .zip(vectors.par_iter())
        .with_min_len(256)
        .for_each(|(row, v)| {
            let (u, _, _) = normalise(*v);
            sh_unit(u, lmax, row);
        });
    Ok(())
}

/// Backward of [`sh_forward`]: **adds** `Σ_c grad_out[e,c]·∂Y_c/∂v_e` into
/// `grad_vectors[e]` (chain rule through the normalisation included).
pub fn sh_backward<T: Real>(
    vectors: &[[T; 3]],
    lmax: usize,
    grad_out: &[T],
    grad_vectors: &mut [[T; 3]],
) -> Result<(), E3nnError> {
    check_lmax(lmax)?;
    let d = sh_dim(lmax);
    check_len("sh_backward grad_out", vectors.len() * d, grad_out.len())?;
    check_len(
        "sh_backward grad_vectors",
        vectors.len(),
        grad_vectors.len(),
    )?;
    grad_vectors
        .par_iter_mut()
        .zip(vectors.par_iter())
        .zip(grad_out.par_chunks(d))
        .with_min_len(256)
        .for_each(|((gv, v), g)| {
            let (u, n, clamped) = normalise(*v);
            let gu = sh_unit_vjp(u, lmax, g);
            if clamped {
                // Constant denominator: û = v / 1e-12.
                for k in 0..3 {
                    gv[k] += gu[k] / n;
                }
            } else {
                // ∂û/∂v = (I − û ûᵀ)/|v|.
                let dot = gu[0] * u[0] + gu[1] * u[1] + gu[2] * u[2];
                for k in 0..3 {
                    gv[k] += (gu[k] - dot * u[k]) / n;
                }
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wigner::wigner_3j;

    fn sh1(v: [f64; 3], lmax: usize) -> Vec<f64> {
        let mut out = vec![0.0; sh_dim(lmax)];
        sh_forward(&[v], lmax, &mut out).unwrap();
        out
    }

    fn vectors() -> Vec<[f64; 3]> {
        vec![
            [0.3, -0.5, 0.8],
            [1.2, 0.1, -0.4],
            [-0.7, -0.9, 0.05],
            [0.0, 2.0, 0.0],
            [0.1, 0.2, -3.0],
        ]
    }

    #[test]
    fn published_values_lmax2() {
        let want = [
            1.0,
            0.5248906591678237,
            -0.8748177652797062,
            1.3997084244475304,
            0.948485717438551,
            -0.5928035733990943,
            -0.26239573205354694,
            -1.5808095290642517,
            1.0868065512316734,
        ];
        let got = sh1([0.3, -0.5, 0.8], 2);
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-14, "{g} vs {w}");
        }
    }

    #[test]
    fn component_normalisation() {
        for v in vectors() {
            let y = sh1(v, 3);
            for l in 0..=3 {
                let n: f64 = y[l * l..(l + 1) * (l + 1)].iter().map(|a| a * a).sum();
                assert!((n - (2 * l + 1) as f64).abs() < 1e-12, "l={l}: {n}");
            }
        }
    }

    /// Y_3 must be the l = 3 part of Y_1 ⊗ Y_2 coupled with e3nn's CG, with a
    /// positive factor (this ties the l = 3 signs to the CG convention).
    #[test]
    fn l3_consistent_with_cg() {
        let c = wigner_3j(1, 2, 3).unwrap();
        for v in vectors() {
            let y = sh1(v, 3);
            let mut p = [0.0; 7];
            for a in 0..3 {
                for b in 0..5 {
                    for k in 0..7 {
                        p[k] += c[(a * 5 + b) * 7 + k] * y[1 + a] * y[4 + b];
                    }
                }
            }
            let pn = p.iter().map(|a| a * a).sum::<f64>().sqrt();
            let dot: f64 = p.iter().zip(&y[9..16]).map(|(a, b)| a * b).sum();
            assert!(
                (dot / (pn * 7f64.sqrt()) - 1.0).abs() < 1e-12,
                "cosine {}",
                dot / (pn * 7f64.sqrt())
            );
        }
        // Same for l = 2 from Y_1 ⊗ Y_1.
        let c = wigner_3j(1, 1, 2).unwrap();
        for v in vectors() {
            let y = sh1(v, 2);
            let mut p = [0.0; 5];
            for a in 0..3 {
                for b in 0..3 {
                    for k in 0..5 {
                        p[k] += c[(a * 3 + b) * 5 + k] * y[1 + a] * y[1 + b];
                    }
                }
            }
            let pn = p.iter().map(|a| a * a).sum::<f64>().sqrt();
            let dot: f64 = p.iter().zip(&y[4..9]).map(|(a, b)| a * b).sum();
            assert!((dot / (pn * 5f64.sqrt()) - 1.0).abs() < 1e-12);
        }
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let vs: Vec<[f64; 3]> = vectors()
            .iter()
            .map(|v| [v[0] * 1.3, v[1] * 1.3, v[2] * 1.3])
            .collect();
        let d = sh_dim(3);
        let g: Vec<f64> = (0..vs.len() * d)
            .map(|i| ((i * 37 % 11) as f64 - 5.0) / 7.0)
            .collect();
        let mut grad = vec![[0.0; 3]; vs.len()];
        sh_backward(&vs, 3, &g, &mut grad).unwrap();
        let h = 1e-6;
        for e in 0..vs.len() {
            for k in 0..3 {
                let mut vp = vs[e];
                vp[k] += h;
                let mut vm = vs[e];
                vm[k] -= h;
                let (yp, ym) = (sh1(vp, 3), sh1(vm, 3));
                let fd: f64 = (0..d)
                    .map(|c| g[e * d + c] * (yp[c] - ym[c]) / (2.0 * h))
                    .sum();
                assert!(
                    (fd - grad[e][k]).abs() < 1e-8,
                    "edge {e} comp {k}: {fd} vs {}",
                    grad[e][k]
                );
            }
        }
    }

    #[test]
    fn zero_vector_and_bad_lmax() {
        let y = sh1([0.0, 0.0, 0.0], 2);
        assert_eq!(y[0], 1.0);
        assert!(y[1..].iter().all(|v| *v == 0.0));
        let mut out = vec![0.0f64; 25];
        assert!(sh_forward(&[[1.0, 0.0, 0.0]], 4, &mut out).is_err());
        assert!(sh_forward(&[[1.0, 0.0, 0.0]], 2, &mut out).is_err());
    }
}
