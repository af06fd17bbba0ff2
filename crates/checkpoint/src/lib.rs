//! ddmlip-checkpoint (work in progress).
