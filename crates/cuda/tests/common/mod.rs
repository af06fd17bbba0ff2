//! What the gated GPU test files share: the device (or a skip) and the
//! SevenNet-0 fixture frames.

use ddmlip_atoms::System;
use ddmlip_cuda::CudaDevice;
use std::path::PathBuf;

/// The GPU named by `DDMLIP_GPU_INDEX` (default 0) when `DDMLIP_GPU_TESTS=1`;
/// otherwise `None` after printing `SKIPPED`. Asking for the tests on a
/// machine without a usable GPU is a failure, not a skip.
pub fn gpu() -> Option<CudaDevice> {
    if std::env::var("DDMLIP_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("SKIPPED: GPU tests run with DDMLIP_GPU_TESTS=1 (scripts/gpu-check.sh)");
        return None;
    }
    let index = std::env::var("DDMLIP_GPU_INDEX")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Some(CudaDevice::open(index).unwrap_or_else(|e| panic!("DDMLIP_GPU_TESTS=1 but: {e}")))
}

/// The SevenNet-0 fixture structures (bulk, slab, molecule, …), from
/// `DDMLIP_FIXTURE_XYZ` or the shared fixtures beside the repository.
pub fn fixture_frames() -> Vec<System> {
    let path = std::env::var_os("DDMLIP_FIXTURE_XYZ")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/fixtures/sevennet0/sevennet0_public.extxyz"
            ))
        });
    let frames = ddmlip::read_structure(&path)
        .unwrap_or_else(|e| panic!("fixture {}: {e} (set DDMLIP_FIXTURE_XYZ)", path.display()));
    assert!(!frames.is_empty());
    frames
}
