//! What the gated GPU test files share: the device (or a skip), the
//! SevenNet-0 fixture frames, and the comparison of two evaluations (and
//! of a split run with one rank).

use ddmlip_atoms::System;
use ddmlip_cuda::{evaluate_decomposed, CudaDevice, GpuModel, GpuOutput, Precision};
use std::path::PathBuf;
use std::time::Duration;

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
#[allow(dead_code)]
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

/// Deadline of every blocking call of a split run in the tests.
#[allow(dead_code)]
pub const TIMEOUT: Duration = Duration::from_secs(300);

/// The outputs two evaluations are compared on: energy, per-atom
/// energies, forces, stress.
#[allow(dead_code)]
#[derive(Debug, Clone)]
pub struct Outputs {
    pub energy: f64,
    pub atomic: Vec<f64>,
    pub forces: Vec<[f64; 3]>,
    pub stress: Option<[f64; 6]>,
}

impl From<&GpuOutput> for Outputs {
    fn from(g: &GpuOutput) -> Self {
        Self {
            energy: g.energy,
            atomic: g.atomic_energies.clone(),
            forces: g.forces.clone(),
            stress: g.stress,
        }
    }
}

#[allow(dead_code)]
pub fn max_abs(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Largest deviation of `got` from `reference` per output, relative to the
/// output's largest magnitude in `reference`: (energy, atomic energies,
/// forces, stress). An exact match is 0 even where that magnitude is 0.
#[allow(dead_code)]
pub fn deviations(reference: impl Into<Outputs>, got: impl Into<Outputs>) -> [f64; 4] {
    let (one, other): (Outputs, Outputs) = (reference.into(), got.into());
    let rel = |d: f64, scale: f64| if d == 0.0 { 0.0 } else { d / scale.max(1e-300) };
    let atomic_scale = max_abs(one.atomic.iter().copied());
    let energy = rel(
        (one.energy - other.energy).abs(),
        one.energy.abs().max(atomic_scale),
    );
    assert_eq!(one.atomic.len(), other.atomic.len());
    let atomic = rel(
        max_abs(one.atomic.iter().zip(&other.atomic).map(|(a, b)| a - b)),
        atomic_scale,
    );
    assert_eq!(one.forces.len(), other.forces.len());
    let forces = rel(
        max_abs(
            one.forces
                .iter()
                .zip(&other.forces)
                .flat_map(|(a, b)| (0..3).map(move |k| a[k] - b[k])),
        ),
        max_abs(one.forces.iter().flatten().copied()),
    );
    let stress = match (one.stress, other.stress) {
        (Some(a), Some(b)) => rel(max_abs((0..6).map(|k| a[k] - b[k])), max_abs(a)),
        (None, None) => 0.0,
        (a, b) => panic!("stress presence differs: reference {a:?}, compared {b:?}"),
    };
    [energy, atomic, forces, stress]
}

/// Asserts every deviation of `d` (in [`deviations`]' order: energy,
/// atomic energies, forces, stress) at most its tolerance in `tol`.
#[allow(dead_code)]
pub fn assert_within(d: [f64; 4], tol: [f64; 4], what: &str) {
    for ((name, e), tol) in ["energy", "atomic energies", "forces", "stress"]
        .iter()
        .zip(d)
        .zip(tol)
    {
        assert!(e <= tol, "{what}: {name} differ by {e:e} relative");
    }
}

/// Runs `model` on `system` on one rank and on each of `ranks`, asserting
/// every atom owned once and every relative deviation ≤ `tol`; returns the
/// largest.
#[allow(dead_code)]
pub fn check_split(
    dev: &CudaDevice,
    model: &GpuModel,
    system: &System,
    p: Precision,
    ranks: &[usize],
    tol: f64,
    what: &str,
) -> f64 {
    let one = model.evaluate(dev, system, p).unwrap();
    let mut worst = 0.0f64;
    for &r in ranks {
        let split = evaluate_decomposed(model, dev, system, p, r, TIMEOUT)
            .unwrap_or_else(|e| panic!("{what}, {r} ranks: {e}"));
        assert_eq!(split.ranks.len(), r);
        assert_eq!(
            split.ranks.iter().map(|x| x.owned).sum::<usize>(),
            system.len(),
            "{what}, {r} ranks: every atom owned once"
        );
        let d = deviations(&one, &split.output);
        eprintln!(
            "{what} ({} atoms), {r} ranks: energy {:.1e} atomic {:.1e} forces {:.1e} stress {:.1e}",
            system.len(),
            d[0],
            d[1],
            d[2],
            d[3]
        );
        assert_within(d, [tol; 4], &format!("{what}, {r} ranks"));
        worst = d.into_iter().fold(worst, f64::max);
    }
    worst
}
