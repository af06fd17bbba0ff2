//! Runtime dispatch of slice kernels to AVX-512 or AVX2+FMA copies.
//!
//! The build's baseline is SSE2; the element-wise loops vectorise four or
//! eight times wider when compiled for the running CPU's vector unit. Each
//! copy compiles the same Rust code, and Rust never contracts a separate
//! `*` and `+` into a fused multiply-add, so every copy gives the same bits
//! (the tests compare against the scalar maps).

pub(crate) use ddmlip_float::Isa;

/// Runs `$body` (an expression over the listed locals) compiled for the
/// best [`Isa`] of the running CPU.
macro_rules! dispatch {
    (($($arg:ident : $ty:ty),*) $body:block) => {{
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
        unsafe fn avx512<T: crate::Scalar>($($arg: $ty),*) $body
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<T: crate::Scalar>($($arg: $ty),*) $body
        fn base<T: crate::Scalar>($($arg: $ty),*) $body
        match crate::ops::simd::Isa::detect() {
            // SAFETY: detect() returns Avx512 only when the running CPU has
            // AVX-512 F and VL, AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            crate::ops::simd::Isa::Avx512 => unsafe { avx512::<T>($($arg),*) },
            // SAFETY: detect() returns Avx2 only when the CPU has AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            crate::ops::simd::Isa::Avx2 => unsafe { avx2::<T>($($arg),*) },
            _ => base::<T>($($arg),*),
        }
    }};
}
pub(crate) use dispatch;

#[cfg(test)]
mod tests {
    use crate::ops::Unary;
    use crate::Scalar;

    /// Every unary map: the slice kernels compiled for this CPU's vectors
    /// give the bits of the scalar maps, element by element (lengths that
    /// are not multiples of any vector width, inputs across each map's
    /// domain), in f64 and f32.
    fn check<T: Scalar>() {
        let maps = [
            Unary::Silu,
            Unary::ScaledSilu(1.679),
            Unary::Sigmoid,
            Unary::Exp,
            Unary::Tanh,
            Unary::Square,
            Unary::Recip,
            Unary::Neg,
            Unary::Scale(-0.37),
            Unary::AddScalar(2.5),
            Unary::Powf(3.0),
            Unary::Powf(-2.0),
            Unary::Cos,
            Unary::Sin,
            Unary::ShiftedSoftplus,
        ];
        for len in [1usize, 7, 33, 1031] {
            let x: Vec<T> = (0..len)
                .map(|k| T::from_f64(-25.0 + 50.0 * ((k * 7919) % len) as f64 / len as f64 + 0.013))
                .collect();
            let g: Vec<T> = (0..len)
                .map(|k| T::from_f64(0.5 - ((k * 104729) % 97) as f64 / 97.0))
                .collect();
            for f in maps {
                let mut y = vec![T::zero(); len];
                f.apply_slice(&x, &mut y);
                for (k, (&xi, &yi)) in x.iter().zip(&y).enumerate() {
                    let want = f.apply(xi);
                    assert!(
                        yi == want || (yi.is_nan() && want.is_nan()),
                        "{f:?} at {k}: {yi:?} vs {want:?}"
                    );
                }
                let mut acc = vec![T::zero(); len];
                f.accumulate_derivative_slice(&x, &y, &g, &mut acc);
                for k in 0..len {
                    let want = T::zero() + g[k] * f.derivative(x[k], y[k]);
                    assert!(
                        acc[k] == want || (acc[k].is_nan() && want.is_nan()),
                        "{f:?}' at {k}: {:?} vs {want:?}",
                        acc[k]
                    );
                }
            }
        }
    }

    #[test]
    fn dispatched_unary_slices_equal_the_scalar_maps_f64() {
        check::<f64>();
    }

    #[test]
    fn dispatched_unary_slices_equal_the_scalar_maps_f32() {
        check::<f32>();
    }
}
