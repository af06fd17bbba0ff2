//! The activations a SevenNet config can name (sevenn's `_const.ACTIVATION`),
//! each scaled as e3nn scales them (`normalize2mom`: unit second moment
//! under a standard normal input).

use crate::radial::{nsilu, nsilu_grad, SILU_NORM};
use crate::real::Real;

/// A scalar activation φ(x) = c·f(x), `c` e3nn's `normalize2mom` constant of
/// `f`. e3nn estimates `c` as `1/sqrt(mean f(z)²)` over one million
/// standard normal samples drawn by torch's CPU generator with seed 0 (and
/// uses 1 when that is within 1e-4 of 1); the constants below are those
/// estimates, which a closed form would miss in the fourth digit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu`: x·sigmoid(x).
    Silu,
    /// `ssp`: the shifted softplus ln(1 + eˣ) − ln 2 (torch's softplus,
    /// which returns x itself above 20).
    Ssp,
    /// `tanh`.
    Tanh,
    /// `abs`: |x| (gradient 0 at 0, as torch's).
    Abs,
    /// `relu`: max(x, 0) (gradient 0 at 0, as torch's).
    Relu,
    /// `sigmoid`: 1/(1 + e⁻ˣ).
    Sigmoid,
    /// `elu`: x for x > 0, eˣ − 1 otherwise.
    Elu,
}

impl Activation {
    /// Every activation with its name in sevenn's configs.
    pub const ALL: [(&'static str, Activation); 7] = [
        ("silu", Activation::Silu),
        ("ssp", Activation::Ssp),
        ("tanh", Activation::Tanh),
        ("abs", Activation::Abs),
        ("relu", Activation::Relu),
        ("sigmoid", Activation::Sigmoid),
        ("elu", Activation::Elu),
    ];

    /// The activation sevenn names `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, a)| a)
    }

    /// sevenn's name of the activation.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("?", |&(n, _)| n)
    }

    /// e3nn's `normalize2mom` constant `c` (see the type's documentation).
    pub fn norm(self) -> f64 {
        match self {
            Self::Silu => SILU_NORM,
            Self::Ssp => 1.878204668541552,
            Self::Tanh => 1.5937334472592695,
            Self::Abs => 1.001110600838467,
            Self::Relu => 1.4163393446331365,
            Self::Sigmoid => 1.8467055342154763,
            Self::Elu => 1.2467863885570512,
        }
    }

    /// φ(x) = c·f(x).
    #[inline(always)]
    pub fn eval<T: Real>(self, x: T) -> T {
        match self {
            // The SiLU of the pretrained models, bit for bit as before.
            Self::Silu => nsilu(x),
            _ => T::from_f64(self.norm()) * self.raw(x),
        }
    }

    /// φ′(x) = c·f′(x).
    #[inline(always)]
    pub fn grad<T: Real>(self, x: T) -> T {
        match self {
            Self::Silu => nsilu_grad(x),
            _ => T::from_f64(self.norm()) * self.raw_grad(x),
        }
    }

    /// Applies φ to every element of `x` into `out` (equal lengths).
    #[inline]
    pub fn eval_slice<T: Real>(self, x: &[T], out: &mut [T]) {
        // One match per slice, not per element: the loops stay branch-free.
        macro_rules! each {
            ($f:expr) => {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = $f(v);
                }
            };
        }
        match self {
            Self::Silu => each!(nsilu),
            Self::Tanh => each!(|v| Self::Tanh.eval(v)),
            Self::Ssp => each!(|v| Self::Ssp.eval(v)),
            Self::Abs => each!(|v| Self::Abs.eval(v)),
            Self::Relu => each!(|v| Self::Relu.eval(v)),
            Self::Sigmoid => each!(|v| Self::Sigmoid.eval(v)),
            Self::Elu => each!(|v| Self::Elu.eval(v)),
        }
    }

    /// f(x), unscaled.
    #[inline(always)]
    fn raw<T: Real>(self, x: T) -> T {
        match self {
            Self::Silu => x / (T::ONE + (-x).exp()),
            Self::Ssp => {
                let sp = if x > T::from_f64(20.0) {
                    x
                } else {
                    x.exp().ln_1p()
                };
                sp - T::from_f64(std::f64::consts::LN_2)
            }
            Self::Tanh => x.tanh(),
            Self::Abs => x.abs(),
            Self::Relu => {
                if x > T::ZERO {
                    x
                } else {
                    T::ZERO
                }
            }
            Self::Sigmoid => T::ONE / (T::ONE + (-x).exp()),
            Self::Elu => {
                if x > T::ZERO {
                    x
                } else {
                    x.exp_m1()
                }
            }
        }
    }

    /// f′(x), unscaled.
    #[inline(always)]
    fn raw_grad<T: Real>(self, x: T) -> T {
        let sigmoid = |x: T| T::ONE / (T::ONE + (-x).exp());
        match self {
            Self::Silu => {
                let s = sigmoid(x);
                s + x * s * (T::ONE - s)
            }
            Self::Ssp => {
                if x > T::from_f64(20.0) {
                    T::ONE
                } else {
                    sigmoid(x)
                }
            }
            Self::Tanh => {
                let t = x.tanh();
                T::ONE - t * t
            }
            Self::Abs => {
                if x > T::ZERO {
                    T::ONE
                } else if x < T::ZERO {
                    -T::ONE
                } else {
                    T::ZERO
                }
            }
            Self::Relu => {
                if x > T::ZERO {
                    T::ONE
                } else {
                    T::ZERO
                }
            }
            Self::Sigmoid => {
                let s = sigmoid(x);
                s * (T::ONE - s)
            }
            Self::Elu => {
                if x > T::ZERO {
                    T::ONE
                } else {
                    x.exp()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants are e3nn's Monte-Carlo estimates of 1/sqrt(E[f(z)²]);
    /// a quadrature of the same integral agrees to the sampling error
    /// (about 1e-3 relative for a million samples).
    #[test]
    fn norms_are_the_second_moment_of_a_standard_normal() {
        for (name, act) in Activation::ALL {
            // Trapezoid rule on [-12, 12] with 240k steps.
            let (lo, n) = (-12.0f64, 240_000);
            let h = 24.0 / n as f64;
            let mut m2 = 0.0;
            for k in 0..=n {
                let z = lo + h * k as f64;
                let w = if k == 0 || k == n { 0.5 } else { 1.0 };
                let f = act.raw(z);
                m2 += w * f * f * (-0.5 * z * z).exp();
            }
            m2 *= h / (2.0 * std::f64::consts::PI).sqrt();
            let exact = 1.0 / m2.sqrt();
            let rel = (act.norm() - exact).abs() / exact;
            assert!(rel < 3e-3, "{name}: {} vs quadrature {exact}", act.norm());
            assert_eq!(Activation::from_name(name), Some(act));
            assert_eq!(act.name(), name);
        }
        assert_eq!(Activation::from_name("gelu"), None);
    }

    #[test]
    fn gradients_match_finite_differences() {
        for (name, act) in Activation::ALL {
            for &x in &[-25.0f64, -3.1, -0.7, -1e-3, 0.4, 1.9, 22.5] {
                let h = 1e-6;
                let fd = (act.eval(x + h) - act.eval(x - h)) / (2.0 * h);
                let g = act.grad(x);
                assert!(
                    (fd - g).abs() < 1e-7 * (1.0 + g.abs()),
                    "{name} at {x}: {g} vs {fd}"
                );
            }
            let xs = [-2.0f64, 0.5, 3.0];
            let mut out = [0.0; 3];
            act.eval_slice(&xs, &mut out);
            for (o, &x) in out.iter().zip(&xs) {
                assert_eq!(*o, act.eval(x), "{name}");
            }
        }
        // torch: softplus(x) = x above 20; the shift makes ssp(0) = 0.
        assert_eq!(Activation::Ssp.raw(0.0f64), 0.0);
        assert_eq!(Activation::Relu.grad(0.0f64), 0.0);
        assert_eq!(Activation::Abs.grad(0.0f64), 0.0);
    }
}
