//! SevenNet-0 on the GPU against the CPU path: f64 to 1e-10 relative
//! (energy, per-atom energies, forces, stress) on the SevenNet-0 fixture
//! frames, f32 within upstream's own f32-vs-f64 gap on the same frames,
//! the same bits on a second run, and the speed and peak memory on rattled
//! silicon. These need an NVIDIA GPU and run only with `DDMLIP_GPU_TESTS=1`
//! (`scripts/gpu-check.sh`); otherwise each test prints `SKIPPED`.
//!
//! Inputs found through the environment on the GPU machine:
//! `DDMLIP_SEVENNET_CHECKPOINT` (the SevenNet-0 checkpoint) and
//! `DDMLIP_FIXTURE_XYZ` (the fixture frames). `DDMLIP_SEVENNET_TIMING_CELLS`
//! (default `5,10,16`) lists the crystal repeats the timing test runs
//! (8·n³ atoms each).

use ddmlip::{evaluate, EvalOptions, EvalResult};
use ddmlip_atoms::{Column, InfoValue, System};
use ddmlip_cuda::sevennet::GpuSevenNet;
use ddmlip_cuda::Precision;
use ddmlip_e3nn::sevennet::SevenNetWeights;
use ddmlip_testkit::build;
use std::time::Instant;

mod common;
use common::{fixture_frames, gpu};

fn weights() -> SevenNetWeights {
    SevenNetWeights::from_checkpoint(ddmlip_testkit::sevennet_checkpoint())
        .expect("read the SevenNet-0 checkpoint")
}

fn cpu_reference(frames: &[System]) -> EvalResult {
    let model = ddmlip_models::load_model("sevennet-0").expect("load sevennet-0");
    evaluate(model.as_ref(), frames, &EvalOptions::default()).expect("CPU evaluation")
}

fn column(sys: &System, name: &str) -> Vec<f64> {
    match sys.properties.arrays.get(name) {
        Some(Column::Float(v, _)) => v.clone(),
        _ => panic!("fixture column {name} missing"),
    }
}

fn max_abs(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(0.0, |m, x| m.max(x.abs()))
}

#[test]
fn gpu_f64_equals_the_cpu_path_on_the_fixture_frames() {
    let Some(dev) = gpu() else { return };
    let frames = fixture_frames();
    let cpu = cpu_reference(&frames);
    let model = GpuSevenNet::new(&dev, &weights(), None, Precision::F64).unwrap();
    let (e_cpu, f_cpu) = (cpu.energy().unwrap().to_vec(), cpu.forces().unwrap());
    let (a_cpu, s_cpu) = (
        cpu.atomic_energies().unwrap().to_vec(),
        cpu.stress().unwrap(),
    );
    let mut offset = 0;
    let (mut worst_e, mut worst_a, mut worst_f, mut worst_s) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (k, sys) in frames.iter().enumerate() {
        let n = sys.len();
        let g = model.evaluate(&dev, sys).unwrap();
        let scale_e = e_cpu[k].abs().max(1.0);
        worst_e = worst_e.max((g.energy - e_cpu[k]).abs() / scale_e);
        let scale_a = max_abs(a_cpu[offset..offset + n].iter().copied()).max(1e-3);
        worst_a = worst_a
            .max(max_abs((0..n).map(|i| g.atomic_energies[i] - a_cpu[offset + i])) / scale_a);
        let scale_f = max_abs(f_cpu[offset..offset + n].iter().flatten().copied()).max(1e-3);
        let df = max_abs(
            (0..n)
                .flat_map(|i| (0..3).map(move |c| (i, c)))
                .map(|(i, c)| g.forces[i][c] - f_cpu[offset + i][c]),
        );
        worst_f = worst_f.max(df / scale_f);
        match (g.stress, s_cpu[k]) {
            (Some(a), Some(b)) => {
                let scale = max_abs(b).max(1e-6);
                worst_s = worst_s.max(max_abs((0..6).map(|c| a[c] - b[c])) / scale);
            }
            (None, None) => {}
            (a, b) => panic!("frame {k}: stress on the GPU {a:?}, on the CPU {b:?}"),
        }
        offset += n;
    }
    eprintln!(
        "sevennet f64 GPU vs CPU over {} frames (relative): energy {worst_e:.2e}, atomic energies {worst_a:.2e}, forces {worst_f:.2e}, stress {worst_s:.2e}",
        frames.len()
    );
    assert!(worst_e <= 1e-10, "energy off by {worst_e:e} relative");
    assert!(worst_a <= 1e-10, "atomic energies off by {worst_a:e}");
    assert!(worst_f <= 1e-10, "forces off by {worst_f:e} relative");
    assert!(worst_s <= 1e-10, "stress off by {worst_s:e} relative");
}

#[test]
fn gpu_f32_is_within_upstreams_own_f32_gap() {
    let Some(dev) = gpu() else { return };
    let frames = fixture_frames();
    let model = GpuSevenNet::new(&dev, &weights(), None, Precision::F32).unwrap();
    let (mut ours_e, mut ours_f, mut up_e, mut up_f) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for sys in &frames {
        let n = sys.len() as f64;
        let g = model.evaluate(&dev, sys).unwrap();
        // Upstream's float64 run is the reference; its float32 run the gap.
        let e64 = sys.energy().expect("fixture energy");
        let e32 = match sys.properties.info.get("energy_f32") {
            Some(InfoValue::Float(x)) => *x,
            other => panic!("fixture energy_f32: {other:?}"),
        };
        ours_e = ours_e.max((g.energy - e64).abs() / n);
        up_e = up_e.max((e32 - e64).abs() / n);
        let f64_ref = sys.forces().expect("fixture forces");
        let f32_up = column(sys, "forces_f32");
        for (i, f) in f64_ref.iter().enumerate() {
            for c in 0..3 {
                ours_f = ours_f.max((g.forces[i][c] - f[c]).abs());
                up_f = up_f.max((f32_up[3 * i + c] - f[c]).abs());
            }
        }
    }
    eprintln!(
        "sevennet f32 GPU vs upstream f64: energy {ours_e:.2e} eV/atom, forces {ours_f:.2e} eV/Å; upstream's f32 gap {up_e:.2e}, {up_f:.2e} (ratios {:.2}, {:.2})",
        ours_e / up_e,
        ours_f / up_f
    );
    assert!(
        ours_e <= 2.0 * up_e,
        "f32 energy error {ours_e:e} eV/atom > 2× upstream's gap {up_e:e}"
    );
    assert!(
        ours_f <= 2.0 * up_f,
        "f32 force error {ours_f:e} eV/Å > 2× upstream's gap {up_f:e}"
    );
}

fn rattled_si(cells: usize, seed: u64) -> System {
    let mut s = build::diamond(14, 5.43, cells);
    build::rattle_uniform(&mut s, 0.05, seed);
    s
}

#[test]
fn a_second_run_gives_the_same_bits() {
    let Some(dev) = gpu() else { return };
    let w = weights();
    let sys = rattled_si(4, 7);
    for precision in [Precision::F64, Precision::F32] {
        let model = GpuSevenNet::new(&dev, &w, None, precision).unwrap();
        let a = model.evaluate(&dev, &sys).unwrap();
        let b = model.evaluate(&dev, &sys).unwrap();
        assert!(a.energy.is_finite() && a.forces.iter().flatten().all(|f| f.is_finite()));
        assert_eq!(
            a.energy.to_bits(),
            b.energy.to_bits(),
            "{precision:?} energy"
        );
        assert!(
            a.forces == b.forces,
            "{precision:?} forces differ between runs"
        );
        assert!(
            a.stress == b.stress,
            "{precision:?} stress differs between runs"
        );
        assert!(
            a.atomic_energies == b.atomic_energies,
            "{precision:?} atomic energies"
        );
    }
}

#[test]
fn gpu_timing_on_rattled_silicon() {
    let Some(dev) = gpu() else { return };
    let w = weights();
    let sizes: Vec<usize> = std::env::var("DDMLIP_SEVENNET_TIMING_CELLS")
        .ok()
        .map(|s| s.split(',').filter_map(|v| v.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![5, 10, 16]);
    for precision in [Precision::F32, Precision::F64] {
        let model = GpuSevenNet::new(&dev, &w, None, precision).unwrap();
        for &cells in &sizes {
            let sys = rattled_si(cells, 11);
            let n = sys.len();
            if precision == Precision::F64 && n > 40_000 {
                continue;
            }
            let first = match model.evaluate(&dev, &sys) {
                Ok(r) => r,
                // The largest sizes probe what fits: a refusal is a result.
                Err(e @ ddmlip_cuda::CudaError::OutOfMemory { .. }) => {
                    eprintln!(
                        "TIMING sevennet {precision:?} {n} atoms: refused before allocating: {e}"
                    );
                    continue;
                }
                Err(e) => panic!("{n} atoms: {e}"),
            };
            let repeats = if n <= 40_000 { 3 } else { 1 };
            let mut times = Vec::new();
            let mut peak = first.peak_bytes.unwrap_or(0);
            for _ in 0..repeats {
                let t = Instant::now();
                let r = model.evaluate(&dev, &sys).unwrap();
                times.push(t.elapsed().as_secs_f64());
                peak = peak.max(r.peak_bytes.unwrap_or(0));
                assert_eq!(r.energy.to_bits(), first.energy.to_bits());
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            eprintln!(
                "TIMING sevennet {precision:?} {n} atoms ({} edges): {:.2} µs/atom/step (median of {repeats}; graph {:.1} ms, model {:.1} ms), peak {:.0} MiB = {:.1} KiB/atom (estimate {:.1} KiB/atom)",
                first.n_pairs,
                median / n as f64 * 1e6,
                first.timings.neighbors_s * 1e3,
                first.timings.model_s * 1e3,
                peak as f64 / (1u64 << 20) as f64,
                peak as f64 / 1024.0 / n as f64,
                first.estimated_bytes.unwrap_or(0) as f64 / 1024.0 / n as f64,
            );
        }
    }
}
