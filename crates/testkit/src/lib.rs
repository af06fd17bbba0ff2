//! Helpers the workspace's tests share, so that a test cannot pass by
//! skipping and no test downloads anything:
//!
//! - [`mpirun_available`]: whether the MPI tests can run; with
//!   `DDMLIP_REQUIRE_MPI=1` (CI sets it) a missing `mpirun` fails the test
//!   instead of skipping it.
//! - [`sevennet_checkpoint`]: the SevenNet-0 checkpoint, which CI setup
//!   fetches once (`scripts/ci-setup.sh`); a missing one fails the test.
//! - [`build`]: crystals and the seeded generator (re-exported from
//!   `ddmlip-atoms`).
//! - [`cli`]: running a workspace binary, reading back its files, the argon
//!   crystal of the MD tests.
//! - [`peak_memory`]: a counting global allocator and the peak heap memory
//!   of a piece of code.
//! - [`pth`]: a checkpoint copy with a patched config, for bad-input tests.

// `peak_memory` implements `GlobalAlloc` (unsafe by definition); nothing
// else may use `unsafe`.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::Command;

pub mod cli;
pub mod peak_memory;
pub mod pth;

pub use ddmlip_atoms::build;
pub use ddmlip_atoms::build::SplitMix64;

/// Environment variable that makes a missing `mpirun` a test failure.
pub const REQUIRE_MPI: &str = "DDMLIP_REQUIRE_MPI";

/// Whether `mpirun` runs. When it does not: with `DDMLIP_REQUIRE_MPI=1`
/// this panics (the test fails); otherwise it prints `SKIPPED` on stderr
/// and returns false, and the caller returns early.
pub fn mpirun_available() -> bool {
    let runs = Command::new("mpirun")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !runs {
        assert!(
            !mpi_required(),
            "mpirun is not on PATH but {REQUIRE_MPI}=1: install OpenMPI (scripts/ci-setup.sh does)"
        );
        eprintln!("SKIPPED: mpirun is not on PATH (set {REQUIRE_MPI}=1 to make this a failure)");
    }
    runs
}

/// Whether `DDMLIP_REQUIRE_MPI` asks for the MPI tests to run.
pub fn mpi_required() -> bool {
    std::env::var(REQUIRE_MPI).is_ok_and(|v| v == "1")
}

/// The SevenNet-0 checkpoint. Panics with the command that fetches it when
/// it is absent: tests never download (CI setup fetches it once).
pub fn sevennet_checkpoint() -> PathBuf {
    ddmlip_checkpoint::find_sevennet_checkpoint().unwrap_or_else(|e| {
        panic!("{e}\nfetch it once with `bash scripts/fetch-sevennet.sh` (scripts/ci-setup.sh does); tests do not download")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirement_is_read_from_the_environment() {
        // Only "1" turns the requirement on; the test reads what CI set.
        let expected = std::env::var(REQUIRE_MPI).as_deref() == Ok("1");
        assert_eq!(mpi_required(), expected);
    }
}
