//! The floating-point abstraction the kernels are generic over: the
//! workspace's one float trait, shared with the op engine.

pub use ddmlip_float::Real;
