//! Built-in models (docs/design.md §5) and the registry that names them.
//!
//! Demo models carry deterministic weights from [`init::Weights`] (a seeded
//! SplitMix64 stream), so every result is reproducible bit for bit.

#![forbid(unsafe_code)]

mod demo;
pub mod init;
mod lj;
mod rebuild;
mod registry;
mod sevennet;
pub mod sevennet_device;

/// Per-phase timings of the SevenNet kernels (off by default; see
/// `ddmlip_e3nn::phases`).
pub use ddmlip_e3nn::phases as sevennet_phases;
pub use demo::{BpDemo, EamDemo, QeqDemo, SchNetDemo, SchNetLayerWeights, SchNetWeights};
pub use lj::{LennardJones, LennardJonesError};
pub use rebuild::RebuildDemo;
pub use registry::{
    load_model, load_model_with_modal, model_names, model_source, pretrained_sevennet_path,
    ModelError, ModelSource, PretrainedSevenNet, PRETRAINED_SEVENNETS, SEVENNET_NAME,
};
pub use sevennet::{RadialEvaluation, SevenNetModel};
