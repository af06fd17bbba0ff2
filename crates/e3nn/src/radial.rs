//! Radial pieces: Bessel basis × cutoff function (XPLOR switch or
//! polynomial envelope; the edge embedding), the normalised SiLU, and the
//! radial MLP producing per-edge TP weights.

use crate::error::{check_len, E3nnError};
use crate::gemm::matmul;
use crate::real::Real;
use rayon::prelude::*;

/// e3nn's `normalize2mom(silu)` constant (Monte-Carlo estimate e3nn computes
/// at build time from torch's seeded RNG; not the exact Gaussian integral).
pub const SILU_NORM: f64 = 1.6791767923989418;

/// Normalised SiLU φ(s) = SILU_NORM · s · sigmoid(s), computed as
/// `SILU_NORM·s / (1 + e⁻ˢ)` with the branch-free exp
/// ([`Real::exp_branchless`], within 1 ulp in f32, 1.5 in f64), so that
/// loops over slices vectorise.
#[inline(always)]
pub fn nsilu<T: Real>(s: T) -> T {
    T::from_f64(SILU_NORM) * s / (T::ONE + (-s).exp_branchless())
}

/// φ′(s) = SILU_NORM · (σ(s) + s·σ(s)(1 − σ(s))), σ(s) = 1 / (1 + e⁻ˢ)
/// with the exp of [`nsilu`].
#[inline(always)]
pub fn nsilu_grad<T: Real>(s: T) -> T {
    nsilu_grad_from_sigmoid(s, T::ONE / (T::ONE + (-s).exp_branchless()))
}

/// [`nsilu_grad`] at `s` from `sig` = σ(s) (as [`nsilu_grad`] computes it).
#[inline(always)]
fn nsilu_grad_from_sigmoid<T: Real>(s: T, sig: T) -> T {
    T::from_f64(SILU_NORM) * (sig + s * sig * (T::ONE - sig))
}

/// `act = φ(z)` and `sig = σ(z)` elementwise (equal lengths), with the
/// bits of [`nsilu`] and of the σ inside [`nsilu_grad`]: one exp per
/// element for the value and, later, the derivative.
#[inline(always)]
fn silu_and_sigmoid_kernel<T: Real>(z: &[T], act: &mut [T], sig: &mut [T]) {
    let c = T::from_f64(SILU_NORM);
    for ((a, sg), &zv) in act.iter_mut().zip(sig.iter_mut()).zip(z) {
        let den = T::ONE + (-zv).exp_branchless();
        *a = c * zv / den;
        *sg = T::ONE / den;
    }
}

/// `g *= φ′(z)` elementwise from `z` and `sig` = σ(z) (equal lengths).
#[inline(always)]
fn mul_silu_grad_kernel<T: Real>(g: &mut [T], z: &[T], sig: &[T]) {
    for ((gv, &zv), &sg) in g.iter_mut().zip(z).zip(sig) {
        *gv *= nsilu_grad_from_sigmoid(zv, sg);
    }
}

/// Copies of the two elementwise kernels compiled for AVX-512 and AVX2, and
/// dispatchers that pick the best the CPU runs (same arithmetic in each).
mod wide {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    unsafe fn silu_and_sigmoid_avx512<T: Real>(z: &[T], act: &mut [T], sig: &mut [T]) {
        silu_and_sigmoid_kernel(z, act, sig)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn silu_and_sigmoid_avx2<T: Real>(z: &[T], act: &mut [T], sig: &mut [T]) {
        silu_and_sigmoid_kernel(z, act, sig)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    unsafe fn mul_silu_grad_avx512<T: Real>(g: &mut [T], z: &[T], sig: &[T]) {
        mul_silu_grad_kernel(g, z, sig)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mul_silu_grad_avx2<T: Real>(g: &mut [T], z: &[T], sig: &[T]) {
        mul_silu_grad_kernel(g, z, sig)
    }

    /// `(AVX-512 F+VL with AVX2+FMA, AVX2+FMA)` available on this CPU.
    #[cfg(target_arch = "x86_64")]
    fn features() -> (bool, bool) {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma");
        (avx2 && has!("avx512f") && has!("avx512vl"), avx2)
    }

    /// [`silu_and_sigmoid_kernel`] at the CPU's best vector width.
    pub(super) fn silu_and_sigmoid<T: Real>(z: &[T], act: &mut [T], sig: &mut [T]) {
        #[cfg(target_arch = "x86_64")]
        match features() {
            // SAFETY: features() found AVX-512 F and VL, AVX2 and FMA.
            (true, _) => return unsafe { silu_and_sigmoid_avx512(z, act, sig) },
            // SAFETY: features() found AVX2 and FMA.
            (false, true) => return unsafe { silu_and_sigmoid_avx2(z, act, sig) },
            _ => {}
        }
        silu_and_sigmoid_kernel(z, act, sig)
    }

    /// [`mul_silu_grad_kernel`] at the CPU's best vector width.
    pub(super) fn mul_silu_grad<T: Real>(g: &mut [T], z: &[T], sig: &[T]) {
        #[cfg(target_arch = "x86_64")]
        match features() {
            // SAFETY: features() found AVX-512 F and VL, AVX2 and FMA.
            (true, _) => return unsafe { mul_silu_grad_avx512(g, z, sig) },
            // SAFETY: features() found AVX2 and FMA.
            (false, true) => return unsafe { mul_silu_grad_avx2(g, z, sig) },
            _ => {}
        }
        mul_silu_grad_kernel(g, z, sig)
    }
}

/// The cutoff function f(r) that multiplies the radial basis (sevenn's
/// `cutoff_function`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CutoffFunction {
    /// XPLOR switch: 1 below `cutoff_on` (Å, `0 < r_on < r_c`), then a C¹
    /// polynomial to 0 at r_c.
    Xplor {
        /// Start of the switch r_on (Å).
        cutoff_on: f64,
    },
    /// Polynomial envelope of DimeNet (`poly_cut`, exponent p):
    /// `1 − (p+1)(p+2)/2·x^p + p(p+2)·x^(p+1) − p(p+1)/2·x^(p+2)`, x = r/r_c.
    Polynomial {
        /// The exponent p ≥ 1 (`poly_cut_p_value`, 6 by default).
        p: u32,
    },
}

/// Radial embedding `emb[n] = (2/r_c)·sin(c_n r)/r · f(r)`.
#[derive(Clone, Debug)]
pub struct EdgeEmbedding {
    /// Bessel frequencies c_n (1/Å), one per basis function.
    pub freqs: Vec<f64>,
    /// Cutoff r_c (Å): the Bessel prefactor and where f reaches 0.
    pub cutoff: f64,
    /// The cutoff function f.
    pub envelope: CutoffFunction,
}

/// Polynomial envelope and its derivative at `r` (as sevenn evaluates it:
/// no clamping, edges lie inside the cutoff).
#[inline]
pub fn polynomial_cutoff<T: Real>(r: T, p: u32, r_c: T) -> (T, T) {
    let x = r / r_c;
    let pf = f64::from(p);
    let (c0, c1, c2) = (
        T::from_f64((pf + 1.0) * (pf + 2.0) / 2.0),
        T::from_f64(pf * (pf + 2.0)),
        T::from_f64(pf * (pf + 1.0) / 2.0),
    );
    let pt = T::from_f64(pf);
    let mut xp1 = T::ONE;
    for _ in 1..p {
        xp1 *= x;
    }
    let xp = xp1 * x;
    let f = T::ONE - c0 * xp + c1 * xp * x - c2 * xp * x * x;
    let df =
        (-c0 * pt * xp1 + c1 * (pt + T::ONE) * xp - c2 * (pt + T::from_f64(2.0)) * xp * x) / r_c;
    (f, df)
}

/// XPLOR switching function and its derivative at `r`.
#[inline]
pub fn xplor_cutoff<T: Real>(r: T, r_on: T, r_c: T) -> (T, T) {
    if r < r_on {
        return (T::ONE, T::ZERO);
    }
    if r >= r_c {
        return (T::ZERO, T::ZERO);
    }
    let (r2, on2, c2) = (r * r, r_on * r_on, r_c * r_c);
    let den = (c2 - on2) * (c2 - on2) * (c2 - on2);
    let f = (c2 - r2) * (c2 - r2) * (c2 + T::from_f64(2.0) * r2 - T::from_f64(3.0) * on2) / den;
    let df = T::from_f64(12.0) * r * (c2 - r2) * (on2 - r2) / den;
    (f, df)
}

impl EdgeEmbedding {
    /// Number of basis functions (columns of the embedding).
    pub fn n_basis(&self) -> usize {
        self.freqs.len()
    }

    /// f(r) and f′(r).
    #[inline]
    fn envelope_at<T: Real>(&self, r: T) -> (T, T) {
        let rc = T::from_f64(self.cutoff);
        match self.envelope {
            CutoffFunction::Xplor { cutoff_on } => xplor_cutoff(r, T::from_f64(cutoff_on), rc),
            CutoffFunction::Polynomial { p } => polynomial_cutoff(r, p, rc),
        }
    }

    /// Lengths inside (0, cutoff) where the embedding is not smooth (its
    /// second derivative jumps): XPLOR's `cutoff_on`.
    pub fn breakpoints(&self) -> Vec<f64> {
        match self.envelope {
            CutoffFunction::Xplor { cutoff_on } if cutoff_on > 0.0 && cutoff_on < self.cutoff => {
                vec![cutoff_on]
            }
            _ => Vec::new(),
        }
    }

    /// The embedding and its first and second derivatives along r at one
    /// length `r ≥ 0` (Å), in f64, into `emb`, `d1` and `d2` (n_basis
    /// each). Near r = 0 the Bessel functions come from their series (no
    /// 0/0 at r = 0, no cancellation just above it).
    pub fn derivatives(&self, r: f64, emb: &mut [f64], d1: &mut [f64], d2: &mut [f64]) {
        let (f, df) = self.envelope_at(r);
        let ddf = self.envelope_second(r);
        let pref = 2.0 / self.cutoff;
        for (((o, g1), g2), &c) in emb
            .iter_mut()
            .zip(d1.iter_mut())
            .zip(d2.iter_mut())
            .zip(&self.freqs)
        {
            // b = sin(cr)/r = c·j(x), x = cr, j(x) = sin(x)/x.
            let x = c * r;
            let (j0, j1, j2) = if x.abs() < 0.5 {
                // j = 1 + x²·Σ q_k, q_k = (−1)^k x^(2k−2)/(2k+1)!, k ≥ 1
                // (to x^16, error < 1e-20); j′ = x·Σ 2k q_k; j″ = Σ 2k(2k−1) q_k.
                let (mut q, mut s0, mut s1, mut s2) = (-1.0 / 6.0, 0.0, 0.0, 0.0);
                for k in 1..=8 {
                    let kk = k as f64;
                    s0 += q;
                    s1 += 2.0 * kk * q;
                    s2 += 2.0 * kk * (2.0 * kk - 1.0) * q;
                    q *= -x * x / ((2.0 * kk + 2.0) * (2.0 * kk + 3.0));
                }
                (1.0 + x * x * s0, x * s1, s2)
            } else {
                let (sn, cs) = (x.sin(), x.cos());
                (
                    sn / x,
                    (x * cs - sn) / (x * x),
                    -sn / x - 2.0 * cs / (x * x) + 2.0 * sn / (x * x * x),
                )
            };
            let (b, db, ddb) = (c * j0, c * c * j1, c * c * c * j2);
            *o = pref * b * f;
            *g1 = pref * (db * f + b * df);
            *g2 = pref * (ddb * f + 2.0 * db * df + b * ddf);
        }
    }

    /// f″(r) of the cutoff function (zero below XPLOR's switch point).
    fn envelope_second(&self, r: f64) -> f64 {
        let rc = self.cutoff;
        match self.envelope {
            CutoffFunction::Xplor { cutoff_on } => {
                if r < cutoff_on || r >= rc {
                    return 0.0;
                }
                let (r2, on2, c2) = (r * r, cutoff_on * cutoff_on, rc * rc);
                let den = (c2 - on2).powi(3);
                // d/dr of 12·r·(c² − r²)(on² − r²)/den.
                12.0 * ((c2 - r2) * (on2 - r2) - 2.0 * r2 * (on2 - r2) - 2.0 * r2 * (c2 - r2)) / den
            }
            CutoffFunction::Polynomial { p } => {
                let pf = f64::from(p);
                let (c0, c1, c2) = (
                    (pf + 1.0) * (pf + 2.0) / 2.0,
                    pf * (pf + 2.0),
                    pf * (pf + 1.0) / 2.0,
                );
                let x = r / rc;
                // x^(p−2), x^(p−1), x^p without negative powers at x = 0.
                let pw = |e: i64| if e == 0 { 1.0 } else { x.powi(e as i32) };
                let (p0, p1, p2) = (pw(i64::from(p) - 2), pw(i64::from(p) - 1), pw(i64::from(p)));
                let ddf = -c0 * pf * (pf - 1.0) * (if p >= 2 { p0 } else { 0.0 })
                    + c1 * (pf + 1.0) * pf * p1
                    - c2 * (pf + 2.0) * (pf + 1.0) * p2;
                ddf / (rc * rc)
            }
        }
    }

    /// `out` (E × n_basis) from edge lengths `lengths` (E, Å, > 0).
    pub fn forward<T: Real>(&self, lengths: &[T], out: &mut [T]) -> Result<(), E3nnError> {
        let nb = self.n_basis();
        check_len("embedding out", lengths.len() * nb, out.len())?;
        let freqs: Vec<T> = self.freqs.iter().map(|&c| T::from_f64(c)).collect();
        let pref = T::from_f64(2.0 / self.cutoff);
        out.par_chunks_mut(nb.max(1))
            .zip(lengths.par_iter())
            .with_min_len(256)
            .for_each(|(row, &r)| {
                let (f, _) = self.envelope_at(r);
                for (o, &c) in row.iter_mut().zip(&freqs) {
                    *o = pref * (c * r).sin() / r * f;
                }
            });
        Ok(())
    }

    /// Backward: `grad_lengths[e] = Σ_n grad_out[e,n]·∂emb[e,n]/∂r_e` (overwrites).
    pub fn backward<T: Real>(
        &self,
        lengths: &[T],
        grad_out: &[T],
        grad_lengths: &mut [T],
    ) -> Result<(), E3nnError> {
        let nb = self.n_basis();
        check_len("embedding grad_out", lengths.len() * nb, grad_out.len())?;
        check_len("embedding grad_lengths", lengths.len(), grad_lengths.len())?;
        let freqs: Vec<T> = self.freqs.iter().map(|&c| T::from_f64(c)).collect();
        let pref = T::from_f64(2.0 / self.cutoff);
        grad_lengths
            .par_iter_mut()
            .zip(lengths.par_iter())
            .zip(grad_out.par_chunks(nb.max(1)))
            .with_min_len(256)
            .for_each(|((gr, &r), g)| {
                let (f, df) = self.envelope_at(r);
                let mut acc = T::ZERO;
                for (&gn, &c) in g.iter().zip(&freqs) {
                    let (s, co) = ((c * r).sin(), (c * r).cos());
                    let b = pref * s / r;
                    let db = pref * (c * r * co - s) / (r * r);
                    acc += gn * (db * f + b * df);
                }
                *gr = acc;
            });
        Ok(())
    }
}

/// e3nn `FullyConnectedNet` without biases: hidden layers
/// `x ← φ(x·W/√fan_in)`, last layer linear. Weights are stored pre-scaled.
#[derive(Clone, Debug)]
pub struct RadialMlp<T> {
    /// Layer widths, `[in, hidden…, out]`.
    pub widths: Vec<usize>,
    /// Per layer, `(in × out)` row-major, already multiplied by 1/√in.
    weights: Vec<Vec<T>>,
    /// The same matrices transposed, `(out × in)` row-major: the input
    /// gradient's products read them row by row, so the GEMM packs them
    /// from contiguous rows rather than with a stride of `out` (the same
    /// values, so the same bits).
    weights_t: Vec<Vec<T>>,
}

/// Rows per parallel task in the MLP GEMMs.
const MLP_CHUNK: usize = 256;

impl<T: Real> RadialMlp<T> {
    /// Builds the MLP from unscaled `(in × out)` row-major matrices
    /// (the checkpoint's `weight_nn.layerK.weight`), one per layer.
    pub fn new(widths: &[usize], weights: &[Vec<f64>]) -> Result<Self, E3nnError> {
        if widths.len() < 2 || weights.len() != widths.len() - 1 {
            return Err(E3nnError::Config(format!(
                "radial MLP: {} widths need {} matrices, got {}",
                widths.len(),
                widths.len().saturating_sub(1),
                weights.len()
            )));
        }
        let mut scaled = Vec::with_capacity(weights.len());
        for (k, w) in weights.iter().enumerate() {
            let (i, o) = (widths[k], widths[k + 1]);
            check_len(&format!("radial MLP layer {k} weight"), i * o, w.len())?;
            let s = 1.0 / (i as f64).sqrt();
            scaled.push(w.iter().map(|&v| T::from_f64(v * s)).collect());
        }
        let weights_t = scaled
            .iter()
            .enumerate()
            .map(|(k, w): (usize, &Vec<T>)| {
                let (i, o) = (widths[k], widths[k + 1]);
                (0..o * i).map(|x| w[(x % i) * o + x / i]).collect()
            })
            .collect();
        Ok(Self {
            widths: widths.to_vec(),
            weights: scaled,
            weights_t,
        })
    }

    /// Input width.
    pub fn dim_in(&self) -> usize {
        self.widths[0]
    }

    /// Per layer `(in, out, matrix)`: the `(in × out)` row-major matrix
    /// already multiplied by 1/√in; hidden layers are followed by [`nsilu`].
    pub(crate) fn layers(&self) -> Vec<(usize, usize, &[T])> {
        self.weights
            .iter()
            .enumerate()
            .map(|(k, w)| (self.widths[k], self.widths[k + 1], &w[..]))
            .collect()
    }

    /// Floating-point operations of the forward GEMMs per row (a
    /// multiply-add is 2; the activations are not counted).
    pub fn flops_per_row(&self) -> usize {
        self.widths.windows(2).map(|w| 2 * w[0] * w[1]).sum()
    }

    /// Output width (W, the number of TP weights per edge).
    pub fn dim_out(&self) -> usize {
        self.widths[self.widths.len() - 1]
    }

    /// `out` (E × dim_out) from `input` (E × dim_in), over rows in parallel.
    pub fn forward(&self, input: &[T], n_rows: usize, out: &mut [T]) -> Result<(), E3nnError> {
        let (di, dout) = (self.dim_in(), self.dim_out());
        check_len("radial MLP input", n_rows * di, input.len())?;
        check_len("radial MLP output", n_rows * dout, out.len())?;
        let nl = self.weights.len();
        out.par_chunks_mut(MLP_CHUNK * dout)
            .zip(input.par_chunks(MLP_CHUNK * di))
            .for_each(|(o, x)| {
                let rows = x.len() / di;
                let mut cur = x.to_vec();
                for (k, w) in self.weights.iter().enumerate() {
                    let (i, on) = (self.widths[k], self.widths[k + 1]);
                    if k + 1 == nl {
                        matmul(rows, i, on, &cur, w, o);
                    } else {
                        let mut next = vec![T::ZERO; rows * on];
                        matmul(rows, i, on, &cur, w, &mut next);
                        next.iter_mut().for_each(|v| *v = nsilu(*v));
                        cur = next;
                    }
                }
            });
        Ok(())
    }

    /// Gradient w.r.t. the input (`grad_in`, E × dim_in, overwritten) from
    /// `grad_out` (E × dim_out). The weights are constants. Hidden
    /// activations are recomputed from `input` (cheaper than storing them).
    pub fn backward(
        &self,
        input: &[T],
        n_rows: usize,
        grad_out: &[T],
        grad_in: &mut [T],
    ) -> Result<(), E3nnError> {
        let (di, dout) = (self.dim_in(), self.dim_out());
        check_len("radial MLP input", n_rows * di, input.len())?;
        check_len("radial MLP grad_out", n_rows * dout, grad_out.len())?;
        check_len("radial MLP grad_in", n_rows * di, grad_in.len())?;
        let nl = self.weights.len();
        grad_in
            .par_chunks_mut(MLP_CHUNK * di)
            .zip(input.par_chunks(MLP_CHUNK * di))
            .zip(grad_out.par_chunks(MLP_CHUNK * dout))
            .for_each(|((gi, x), go)| {
                let rows = x.len() / di;
                // Forward, keeping the pre-activations of the hidden layers.
                let mut pre: Vec<Vec<T>> = Vec::with_capacity(nl - 1);
                let mut cur = x.to_vec();
                for k in 0..nl - 1 {
                    let (i, on) = (self.widths[k], self.widths[k + 1]);
                    let mut z = vec![T::ZERO; rows * on];
                    matmul(rows, i, on, &cur, &self.weights[k], &mut z);
                    cur = z.iter().map(|&v| nsilu(v)).collect();
                    pre.push(z);
                }
                // Reverse.
                let mut g = go.to_vec();
                for k in (0..nl).rev() {
                    let (i, on) = (self.widths[k], self.widths[k + 1]);
                    if k == 0 {
                        matmul(rows, on, i, &g, &self.weights_t[k], gi);
                    } else {
                        let mut gprev = vec![T::ZERO; rows * i];
                        matmul(rows, on, i, &g, &self.weights_t[k], &mut gprev);
                        for (gv, &z) in gprev.iter_mut().zip(&pre[k - 1]) {
                            *gv *= nsilu_grad(z);
                        }
                        g = gprev;
                    }
                }
            });
        Ok(())
    }
}

/// Reusable buffers for running a [`RadialMlp`] on blocks of at most
/// `max_rows` rows: hidden pre-activations and their sigmoids (kept for the
/// backward), hidden activations and two gradient buffers.
#[derive(Clone, Debug)]
pub(crate) struct MlpScratch<T> {
    max_rows: usize,
    /// Per hidden layer, pre-activations `z_k` (max_rows × width).
    pre: Vec<Vec<T>>,
    /// Per hidden layer, activations `φ(z_k)`.
    act: Vec<Vec<T>>,
    /// Per hidden layer, `σ(z_k)` (for φ′ in the backward without a second exp).
    sig: Vec<Vec<T>>,
    /// Ping-pong buffers for hidden-layer gradients (max_rows × max hidden width).
    grad: [Vec<T>; 2],
}

impl<T: Real> RadialMlp<T> {
    /// Scratch for blocks of up to `max_rows` rows.
    pub(crate) fn scratch(&self, max_rows: usize) -> MlpScratch<T> {
        let hidden = &self.widths[1..self.widths.len() - 1];
        let widest = hidden.iter().copied().max().unwrap_or(0);
        MlpScratch {
            max_rows,
            pre: hidden
                .iter()
                .map(|&w| vec![T::ZERO; max_rows * w])
                .collect(),
            act: hidden
                .iter()
                .map(|&w| vec![T::ZERO; max_rows * w])
                .collect(),
            sig: hidden
                .iter()
                .map(|&w| vec![T::ZERO; max_rows * w])
                .collect(),
            grad: [
                vec![T::ZERO; max_rows * widest],
                vec![T::ZERO; max_rows * widest],
            ],
        }
    }

    /// Forward of `rows ≤ max_rows` rows (`input` rows × dim_in) into `out`
    /// (rows × dim_out), leaving the hidden pre-activations in `s` for
    /// [`Self::backward_block`]. Same arithmetic as [`Self::forward`].
    pub(crate) fn forward_block(
        &self,
        input: &[T],
        rows: usize,
        s: &mut MlpScratch<T>,
        out: &mut [T],
    ) {
        debug_assert!(rows <= s.max_rows);
        let nl = self.weights.len();
        for (k, w) in self.weights.iter().enumerate() {
            let (i, on) = (self.widths[k], self.widths[k + 1]);
            let x = if k == 0 {
                &input[..rows * i]
            } else {
                &s.act[k - 1][..rows * i]
            };
            if k + 1 == nl {
                matmul(rows, i, on, x, w, &mut out[..rows * on]);
            } else {
                let z = &mut s.pre[k][..rows * on];
                matmul(rows, i, on, x, w, z);
                wide::silu_and_sigmoid(z, &mut s.act[k][..rows * on], &mut s.sig[k][..rows * on]);
            }
        }
    }

    /// Input gradient (`grad_in`, rows × dim_in, overwritten) of the block
    /// last passed to [`Self::forward_block`] with `s`, from `grad_out`
    /// (rows × dim_out). Same arithmetic as [`Self::backward`].
    pub(crate) fn backward_block(
        &self,
        rows: usize,
        s: &mut MlpScratch<T>,
        grad_out: &[T],
        grad_in: &mut [T],
    ) {
        let nl = self.weights.len();
        let [ga, gb] = &mut s.grad;
        // `cur` holds the gradient w.r.t. the output of layer k (None: grad_out).
        let mut cur_is_a: Option<bool> = None;
        for k in (0..nl).rev() {
            let (i, on) = (self.widths[k], self.widths[k + 1]);
            let g: &[T] = match cur_is_a {
                None => &grad_out[..rows * on],
                Some(true) => &ga[..rows * on],
                Some(false) => &gb[..rows * on],
            };
            if k == 0 {
                matmul(rows, on, i, g, &self.weights_t[k], &mut grad_in[..rows * i]);
            } else {
                // Write into the buffer `g` does not live in.
                let into_a = cur_is_a != Some(true);
                let (src, dst): (&[T], &mut [T]) = match cur_is_a {
                    None => (&grad_out[..rows * on], &mut ga[..rows * i]),
                    Some(true) => (&ga[..rows * on], &mut gb[..rows * i]),
                    Some(false) => (&gb[..rows * on], &mut ga[..rows * i]),
                };
                matmul(rows, on, i, src, &self.weights_t[k], dst);
                wide::mul_silu_grad(dst, &s.pre[k - 1][..rows * i], &s.sig[k - 1][..rows * i]);
                cur_is_a = Some(into_a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FREQS: [f64; 8] = [
        0.5078758001,
        1.1099243164,
        1.7265003920,
        2.3766531945,
        3.0391683579,
        3.7200760841,
        4.4141530991,
        5.1186308861,
    ];

    fn emb() -> EdgeEmbedding {
        EdgeEmbedding {
            freqs: FREQS.to_vec(),
            cutoff: 5.0,
            envelope: CutoffFunction::Xplor { cutoff_on: 4.5 },
        }
    }

    /// DimeNet's envelope: 1 at 0, 0 with zero slope at r_c, and a
    /// derivative that matches central differences.
    #[test]
    fn polynomial_cutoff_ends_and_derivative() {
        for p in [2u32, 6, 9] {
            let (f0, _) = polynomial_cutoff(1e-9f64, p, 5.0);
            assert!((f0 - 1.0).abs() < 1e-12, "p={p}: f(0) = {f0}");
            let (f1, d1) = polynomial_cutoff(5.0f64, p, 5.0);
            assert!(
                f1.abs() < 1e-12 && d1.abs() < 1e-12,
                "p={p}: f(rc) = {f1}, f'(rc) = {d1}"
            );
            for r in [0.7f64, 2.5, 4.2, 4.9] {
                let h = 1e-6;
                let fd = (polynomial_cutoff(r + h, p, 5.0).0 - polynomial_cutoff(r - h, p, 5.0).0)
                    / (2.0 * h);
                let (_, d) = polynomial_cutoff(r, p, 5.0);
                assert!((fd - d).abs() < 1e-8, "p={p} r={r}: {d} vs {fd}");
            }
        }
    }

    #[test]
    fn xplor_published_values() {
        let cases = [
            (4.4f64, 1.0f64),
            (4.5, 1.0),
            (4.6, 0.9039553707537549),
            (4.75, 0.5197322860475287),
            (4.9, 0.11221066161247889),
            (5.0, 0.0),
        ];
        for (r, want) in cases {
            let (f, _) = xplor_cutoff(r, 4.5, 5.0);
            assert!((f - want).abs() < 1e-14, "{r}: {f}");
        }
    }

    #[test]
    fn embedding_published_values() {
        // Frequencies in the guide are printed to 10 digits, so compare to 1e-9.
        let want = [
            (
                1.0,
                [
                    0.19452890525096841,
                    0.3582660118132826,
                    0.39516103690024873,
                    0.2769973296808272,
                    0.04089812210920756,
                    -0.21870190134085263,
                    -0.38234253400509516,
                    -0.367444941748175,
                ],
            ),
            (
                2.0,
                [
                    0.16997537421494743,
                    0.15933139449744796,
                    -0.06127986866899346,
                    -0.19983259992594185,
                    -0.04068378387973259,
                    0.18311752822121466,
                    0.11234539700651708,
                    -0.14519950449794453,
                ],
            ),
            (
                4.9,
                [
                    0.005565400665464261,
                    -0.006848756625718413,
                    0.007529626685591839,
                    -0.007292024431850222,
                    0.006672525498370641,
                    -0.0053311300062028775,
                    0.0032422631296060186,
                    -0.0004710758488091288,
                ],
            ),
        ];
        let e = emb();
        let mut out = vec![0.0f64; 8];
        for (r, w) in want {
            e.forward(&[r], &mut out).unwrap();
            for (g, w) in out.iter().zip(w) {
                assert!((g - w).abs() < 1e-9, "r={r}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn embedding_backward_fd() {
        let e = emb();
        let rs = [0.9, 2.3, 4.55, 4.8, 4.99];
        let g: Vec<f64> = (0..rs.len() * 8).map(|i| (i as f64 * 0.37).sin()).collect();
        let mut gr = vec![0.0; rs.len()];
        e.backward(&rs, &g, &mut gr).unwrap();
        let h = 1e-6;
        for (k, &r) in rs.iter().enumerate() {
            let (mut p, mut m) = (vec![0.0; 8], vec![0.0; 8]);
            e.forward(&[r + h], &mut p).unwrap();
            e.forward(&[r - h], &mut m).unwrap();
            let fd: f64 = (0..8)
                .map(|n| g[k * 8 + n] * (p[n] - m[n]) / (2.0 * h))
                .sum();
            assert!((fd - gr[k]).abs() < 1e-8, "{r}: {fd} vs {}", gr[k]);
        }
    }

    #[test]
    fn nsilu_grad_fd() {
        for s in [-3.0, -0.5, 0.0, 0.7, 4.0f64] {
            let fd = (nsilu(s + 1e-6) - nsilu(s - 1e-6)) / 2e-6;
            assert!((fd - nsilu_grad(s)).abs() < 1e-8);
        }
        assert!((nsilu(1.0f64) - SILU_NORM / (1.0 + (-1.0f64).exp())).abs() < 1e-15);
    }

    fn random(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn mlp_forward_matches_naive_and_backward_fd() {
        let widths = [8, 16, 12, 20];
        let ws: Vec<Vec<f64>> = (0..3)
            .map(|k| random(widths[k] * widths[k + 1], k as u64 + 1))
            .collect();
        let mlp = RadialMlp::<f64>::new(&widths, &ws).unwrap();
        let n = 300; // crosses a chunk boundary
        let x = random(n * 8, 9);
        let mut out = vec![0.0; n * 20];
        mlp.forward(&x, n, &mut out).unwrap();
        // Naive reference.
        let naive = |row: &[f64]| -> Vec<f64> {
            let mut cur = row.to_vec();
            for k in 0..3 {
                let (i, o) = (widths[k], widths[k + 1]);
                let mut nx = vec![0.0; o];
                for b in 0..o {
                    for a in 0..i {
                        nx[b] += cur[a] * ws[k][a * o + b];
                    }
                    nx[b] /= (i as f64).sqrt();
                    if k < 2 {
                        nx[b] = SILU_NORM * nx[b] / (1.0 + (-nx[b]).exp());
                    }
                }
                cur = nx;
            }
            cur
        };
        for r in [0, 17, 299] {
            let want = naive(&x[r * 8..r * 8 + 8]);
            for c in 0..20 {
                assert!((out[r * 20 + c] - want[c]).abs() < 1e-12);
            }
        }
        let g = random(n * 20, 5);
        let mut gi = vec![0.0; n * 8];
        mlp.backward(&x, n, &g, &mut gi).unwrap();
        let h = 1e-6;
        for r in [3, 260] {
            for a in 0..8 {
                let mut xp = x[r * 8..r * 8 + 8].to_vec();
                let mut xm = xp.clone();
                xp[a] += h;
                xm[a] -= h;
                let (yp, ym) = (naive(&xp), naive(&xm));
                let fd: f64 = (0..20)
                    .map(|c| g[r * 20 + c] * (yp[c] - ym[c]) / (2.0 * h))
                    .sum();
                assert!(
                    (fd - gi[r * 8 + a]).abs() < 1e-7,
                    "{fd} vs {}",
                    gi[r * 8 + a]
                );
            }
        }
    }
}
