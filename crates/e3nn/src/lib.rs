//! Fused CPU kernels for e3nn-style equivariant networks, and the SevenNet
//! potentials built from them.
//!
//! Every kernel works on plain row-major slices, is generic over [`Real`]
//! (`f32` / `f64`), and comes with a hand-written backward pass. Kernels that
//! touch graphs take explicit index arrays and row counts, so they can run on a
//! rank's local rows (owned + ghost atoms) of a domain-decomposed system.

// The kernels index small fixed-size arrays (CG tensors, 3-vectors) by
// component; explicit index loops mirror the formulas they implement.
#![allow(clippy::needless_range_loop)]

pub mod activation;
pub mod affine;
pub mod conv;
pub mod error;
pub mod fcn;
pub mod gate;
mod gemm;
pub mod irreps;
pub mod phases;
pub mod radial;
pub mod radial_table;
pub mod real;
pub mod sevennet;
pub mod sevennet_config;
pub mod sh;
pub mod species_linear;
pub mod wigner;
mod work;

pub use activation::Activation;
pub use affine::AffineLinear;
pub use conv::{
    conv_backward, conv_forward, radial_conv_backward, radial_conv_backward_with,
    radial_conv_forward, radial_conv_forward_with, BlockLayout, ConvGraph, ConvPaths, EdgeRadial,
    TpPath,
};
pub use error::E3nnError;
pub use fcn::FullyConnectedNet;
pub use gate::Gate;
pub use irreps::{Irrep, Irreps, IrrepsLinear};
pub use radial::{nsilu, nsilu_grad, CutoffFunction, EdgeEmbedding, RadialMlp, SILU_NORM};
pub use radial_table::RadialTable;
pub use real::Real;
pub use sh::{sh_backward, sh_dim, sh_forward};
pub use wigner::wigner_3j;
