//! ddmlip-spec (work in progress).
