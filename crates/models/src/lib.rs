//! ddmlip-models (work in progress).
