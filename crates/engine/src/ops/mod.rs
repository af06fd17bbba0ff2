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
mod radial;
mod shape;

pub use elementwise::Unary;
pub use geometry::PeriodicShifts;
pub use radial::Radial;

/// Below this many elements an op runs on the calling thread.
pub(crate) const PAR_THRESHOLD: usize = 1 << 14;
