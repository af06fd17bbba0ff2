//! Radial bases and cutoff envelopes of a distance column (rows×1 → rows×K).

use crate::graph::NodeSpec;
use crate::{EngineError, Graph, Scalar, Tensor};
use rayon::prelude::*;
use std::f64::consts::PI;

/// A family of K radial functions of one distance, with derivatives.
#[derive(Debug, Clone, PartialEq)]
pub enum Radial {
    /// `exp(−γ (d − μ_k)²)` for each centre μ_k.
    Gaussian {
        /// Centres μ_k (Å); K = their count.
        centers: Vec<f64>,
        /// Width γ (1/Å²), positive.
        gamma: f64,
    },
    /// `√(2/rc) · sin(kπd/rc)/d`, k = 1..=n.
    Bessel {
        /// Number of basis functions K.
        n: usize,
        /// Cutoff rc (Å), positive.
        cutoff: f64,
    },
    /// `½(cos(πd/rc) + 1)` for d < rc, else 0 (K = 1).
    CosineCutoff {
        /// Cutoff rc (Å), positive.
        cutoff: f64,
    },
    /// DimeNet's polynomial envelope of order p on x = d/rc, 0 beyond rc (K = 1).
    PolynomialCutoff {
        /// Cutoff rc (Å), positive.
        cutoff: f64,
        /// Envelope order p (DimeNet uses 6).
        p: i32,
    },
}

impl Radial {
    /// K, the number of functions (columns of the output).
    pub fn width(&self) -> usize {
        match self {
            Radial::Gaussian { centers, .. } => centers.len(),
            Radial::Bessel { n, .. } => *n,
            _ => 1,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Radial::Gaussian { .. } => "gaussian_basis",
            Radial::Bessel { .. } => "bessel_basis",
            Radial::CosineCutoff { .. } => "cosine_cutoff",
            Radial::PolynomialCutoff { .. } => "polynomial_cutoff",
        }
    }

    /// Writes values and derivatives of the K functions at `d` (computed in f64).
    pub(crate) fn eval(&self, d: f64, val: &mut [f64], der: &mut [f64]) {
        match self {
            Radial::Gaussian { centers, gamma } => {
                for (k, &mu) in centers.iter().enumerate() {
                    let x = d - mu;
                    let v = (-gamma * x * x).exp();
                    val[k] = v;
                    der[k] = -2.0 * gamma * x * v;
                }
            }
            Radial::Bessel { n, cutoff } => {
                let pre = (2.0 / cutoff).sqrt();
                for k in 0..*n {
                    let c = (k + 1) as f64 * PI / cutoff;
                    let (s, co) = (c * d).sin_cos();
                    val[k] = pre * s / d;
                    der[k] = pre * (c * d * co - s) / (d * d);
                }
            }
            Radial::CosineCutoff { cutoff } => {
                if d < *cutoff {
                    val[0] = 0.5 * ((PI * d / cutoff).cos() + 1.0);
                    der[0] = -0.5 * PI / cutoff * (PI * d / cutoff).sin();
                } else {
                    val[0] = 0.0;
                    der[0] = 0.0;
                }
            }
            Radial::PolynomialCutoff { cutoff, p } => {
                let x = d / cutoff;
                if x < 1.0 {
                    let pf = *p as f64;
                    let (a, b, c) = (
                        (pf + 1.0) * (pf + 2.0) / 2.0,
                        pf * (pf + 2.0),
                        pf * (pf + 1.0) / 2.0,
                    );
                    let xp = x.powi(*p);
                    val[0] = 1.0 - a * xp + b * xp * x - c * xp * x * x;
                    der[0] =
                        (-a * pf * xp / x + b * (pf + 1.0) * xp - c * (pf + 2.0) * xp * x) / cutoff;
                } else {
                    val[0] = 0.0;
                    der[0] = 0.0;
                }
            }
        }
    }
}

impl<T: Scalar> Graph<T> {
    /// Expands a distance column (rows×1) into K radial functions (rows×K).
    pub fn radial(&mut self, d: Tensor, f: Radial) -> Result<Tensor, EngineError> {
        let (rows, cols) = self.shape(d);
        if cols != 1 {
            return Err(EngineError::shape(
                f.name(),
                format!("expects a rows×1 distance column, got {rows}×{cols}"),
            ));
        }
        let k = f.width();
        if let Some(backend) = self.device_for_op() {
            return self.radial_device(backend, d, f, (rows, k));
        }
        self.ensure_host(&[d])?;
        let dv = &self.nodes[d.id].value;
        let mut val = self.pool.zeroed(rows * k);
        let mut der = self.pool.zeroed(rows * k);
        // Rows are independent; chunks keep one small scratch pair per task.
        let chunk = 1024;
        val.par_chunks_mut(chunk * k.max(1))
            .zip(der.par_chunks_mut(chunk * k.max(1)))
            .enumerate()
            .for_each(|(ci, (vals, ders))| {
                let (mut v64, mut d64) = (vec![0.0; k], vec![0.0; k]);
                for (lr, (vrow, drow)) in vals
                    .chunks_mut(k.max(1))
                    .zip(ders.chunks_mut(k.max(1)))
                    .enumerate()
                {
                    f.eval(dv[ci * chunk + lr].to_f64_lossless(), &mut v64, &mut d64);
                    for c in 0..k {
                        vrow[c] = T::from_f64(v64[c]);
                        drow[c] = T::from_f64(d64[c]);
                    }
                }
            });
        let nd = &self.nodes[d.id];
        let spec = NodeSpec {
            op: f.name().into(),
            rows,
            cols: k,
            domain: nd.domain,
            fresh: nd.fresh,
            replicated: nd.replicated,
        };
        // The derivative table is kept for the backward pass (rows×K, like the output).
        let der = self.save_for_backward(der);
        self.push_op(
            spec,
            val,
            &[d],
            &[],
            None,
            Box::new(move |ctx, g| {
                if !ctx.wants(d) {
                    return Ok(());
                }
                let mut gd = ctx.zeroed(rows);
                gd.par_iter_mut()
                    .enumerate()
                    .with_min_len(1024)
                    .for_each(|(r, o)| {
                        *o = (0..k).map(|c| g[r * k + c] * der[r * k + c]).sum();
                    });
                ctx.accumulate(d, gd);
                Ok(())
            }),
        )
    }
}
