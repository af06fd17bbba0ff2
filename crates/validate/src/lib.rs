//! ddmlip-validate (work in progress).
