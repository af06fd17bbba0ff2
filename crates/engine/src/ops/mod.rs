//! The ops of the engine, grouped by kind. All are methods of [`crate::Graph`].
//!
//! Every op computes its forward value eagerly, records a backward closure,
//! and is rayon-parallel over rows for large inputs.

mod elementwise;
mod geometry;
mod index;
mod linalg;
pub mod message;
pub mod opaque;
mod pointwise;
mod radial;
mod shape;

pub use elementwise::Unary;
pub use geometry::PeriodicShifts;
pub use pointwise::{Pointwise, Reg};
pub use radial::Radial;

/// Below this many elements an op runs on the calling thread.
pub(crate) const PAR_THRESHOLD: usize = 1 << 14;

/// `out[i] = f(i)` for every element, over rayon above [`PAR_THRESHOLD`].
pub(crate) fn map_into<T: Send>(out: &mut [T], f: impl Fn(usize) -> T + Sync) {
    use rayon::prelude::*;
    if out.len() >= PAR_THRESHOLD {
        out.par_iter_mut().enumerate().for_each(|(i, o)| *o = f(i));
    } else {
        out.iter_mut().enumerate().for_each(|(i, o)| *o = f(i));
    }
}
