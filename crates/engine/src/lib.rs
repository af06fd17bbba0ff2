//! ddmlip-engine (work in progress).
