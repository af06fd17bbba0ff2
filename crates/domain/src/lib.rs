//! Spatial domain decomposition for ddmlip: which rank owns each atom, which
//! periodic images each rank holds as ghosts, the halo plan that keeps ghost
//! rows fresh, a health check of the split, and an SVG picture of it.

#![forbid(unsafe_code)]

pub mod partition;
pub use partition::*;
mod halo;
pub mod serde_bits;
pub mod svg;

pub use halo::{HaloRuntime, LocalHaloPlan};
