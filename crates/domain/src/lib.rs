//! ddmlip-domain (work in progress).
