//! ddmlip-neighbors (work in progress).
