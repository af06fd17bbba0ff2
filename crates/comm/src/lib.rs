//! ddmlip-comm (work in progress).
