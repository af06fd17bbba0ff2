//! ddmlip-e3nn (work in progress).
