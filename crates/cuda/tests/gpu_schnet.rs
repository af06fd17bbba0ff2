//! SchNet (`schnet-demo`) on the GPU against the CPU op engine's run of the
//! same model: f64 to 1e-10 relative (energy, per-atom energies, forces,
//! stress) on crystals, a rattled liquid-like cell, a slab, a cluster and
//! the fixture frames; f32 within the f32 tolerances of the Lennard-Jones
//! tests against CPU f64 (the CPU's own f32 gap printed beside it); the
//! same bits every run; split runs over 2–8 ranks sharing the GPU equal the
//! one-rank run to 1e-10 in f64; typed errors.
//! These need an NVIDIA GPU and run only with `DDMLIP_GPU_TESTS=1`
//! (`scripts/gpu-check.sh`); otherwise each test prints `SKIPPED`.

use ddmlip::{evaluate, DType, EvalOptions, EvalResult, Model};
use ddmlip_atoms::System;
use ddmlip_cuda::{CudaDevice, GpuModel, Precision};
use ddmlip_models::SchNetDemo;
use ddmlip_testkit::build;

mod common;
use common::{assert_within, check_split, deviations, fixture_frames, gpu, Outputs};

const F32_ENERGY_TOL: f64 = 1e-5;
const F32_FORCE_TOL: f64 = 1e-4;

fn model(dev: &CudaDevice, p: Precision) -> GpuModel {
    GpuModel::schnet(dev, &SchNetDemo::default().weights(), p).unwrap()
}

/// Systems of several kinds and species (Z up to 94).
fn systems() -> Vec<(&'static str, System)> {
    let mut si = build::diamond(14, 5.43, 3);
    build::rattle_uniform(&mut si, 0.15, 21);
    let mut cu = build::demo_copper(3);
    build::rattle_uniform(&mut cu, 0.1, 22);
    let mut hot = build::fcc(18, 5.0, 3);
    build::rattle_uniform(&mut hot, 0.9, 23);
    let mut mixed = build::fcc(29, 3.7, 3);
    for (i, z) in mixed.numbers.iter_mut().enumerate() {
        *z = [1, 8, 29, 79, 94][i % 5];
    }
    build::rattle_uniform(&mut mixed, 0.2, 24);
    let mut slab = si.clone();
    slab.pbc = [true, true, false];
    let mut cluster = build::fcc(29, 3.7, 2);
    build::rattle_uniform(&mut cluster, 0.1, 25);
    cluster.pbc = [false; 3];
    cluster.cell = None;
    let mut out = vec![
        ("si 216 rattled", si),
        ("cu crystal", cu),
        ("ar strongly rattled", hot),
        ("five species", mixed),
        ("si slab", slab),
        ("cu cluster", cluster),
    ];
    out.extend(fixture_frames().into_iter().map(|f| ("a fixture frame", f)));
    out
}

impl From<&EvalResult> for Outputs {
    fn from(c: &EvalResult) -> Self {
        Self {
            energy: c.energy().expect("energy")[0],
            atomic: c.atomic_energies().expect("atomic energies").to_vec(),
            forces: c.forces().expect("forces"),
            stress: c.stress().and_then(|s| s[0]),
        }
    }
}

fn cpu(system: &System, dtype: DType) -> Outputs {
    let m: Box<dyn Model> = Box::new(SchNetDemo::default());
    let opts = EvalOptions {
        dtype,
        ..EvalOptions::default()
    };
    (&evaluate(m.as_ref(), std::slice::from_ref(system), &opts).unwrap()).into()
}

#[test]
fn gpu_schnet_f64_equals_the_cpu_run_to_1e_10() {
    let Some(dev) = gpu() else { return };
    let m = model(&dev, Precision::F64);
    for (what, system) in systems() {
        let g = m.evaluate(&dev, &system, Precision::F64).unwrap();
        let d = deviations(cpu(&system, DType::F64), &g);
        eprintln!(
            "schnet f64 GPU vs CPU, {what} ({} atoms, {} pairs): energy {:.1e} atomic {:.1e} forces {:.1e} stress {:.1e}",
            system.len(),
            g.n_pairs,
            d[0],
            d[1],
            d[2],
            d[3]
        );
        assert_within(d, [1e-10; 4], what);
    }
}

#[test]
fn gpu_schnet_f32_is_within_its_tolerance_of_cpu_f64() {
    let Some(dev) = gpu() else { return };
    let m = model(&dev, Precision::F32);
    for (what, system) in systems() {
        let g = m.evaluate(&dev, &system, Precision::F32).unwrap();
        let reference = cpu(&system, DType::F64);
        let d = deviations(reference.clone(), &g);
        let own = deviations(reference, cpu(&system, DType::F32));
        eprintln!(
            "schnet f32 GPU vs CPU f64, {what}: energy {:.1e} atomic {:.1e} forces {:.1e} stress {:.1e} \
             (CPU f32: {:.1e} {:.1e} {:.1e} {:.1e})",
            d[0], d[1], d[2], d[3], own[0], own[1], own[2], own[3]
        );
        assert!(d[0] <= F32_ENERGY_TOL, "{what}: energy {:e}", d[0]);
        assert!(d[1] <= F32_ENERGY_TOL * 10.0, "{what}: atomic {:e}", d[1]);
        assert!(d[2] <= F32_FORCE_TOL, "{what}: forces {:e}", d[2]);
        assert!(d[3] <= F32_FORCE_TOL, "{what}: stress {:e}", d[3]);
    }
}

#[test]
fn gpu_schnet_gives_the_same_bits_every_run() {
    let Some(dev) = gpu() else { return };
    let (_, system) = systems().swap_remove(0);
    for p in [Precision::F64, Precision::F32] {
        let m = model(&dev, p);
        let first = m.evaluate(&dev, &system, p).unwrap();
        for _ in 0..3 {
            let again = m.evaluate(&dev, &system, p).unwrap();
            assert_eq!(again.energy.to_bits(), first.energy.to_bits());
            assert!(again.forces == first.forces && again.stress == first.stress);
            assert!(again.atomic_energies == first.atomic_energies);
        }
    }
}

#[test]
fn split_schnet_equals_one_rank_in_f64() {
    let Some(dev) = gpu() else { return };
    let m = model(&dev, Precision::F64);
    let mut worst = 0.0f64;
    let mut big = build::diamond(14, 5.43, 5);
    build::rattle_uniform(&mut big, 0.15, 26);
    let mut cases = systems();
    cases.push(("si 1000 rattled", big));
    for (what, system) in cases {
        let what = format!("schnet f64 split vs one rank, {what}");
        let ranks = [2, 3, 4, 8];
        worst = worst.max(check_split(
            &dev,
            &m,
            &system,
            Precision::F64,
            &ranks,
            1e-10,
            &what,
        ));
    }
    eprintln!("schnet f64 split vs one rank: worst {worst:.1e} relative");
}

#[test]
fn gpu_schnet_refuses_unknown_elements_with_a_typed_error() {
    let Some(dev) = gpu() else { return };
    let m = model(&dev, Precision::F64);
    let mut s = build::fcc(29, 3.7, 2);
    s.numbers[3] = 100;
    let e = m.evaluate(&dev, &s, Precision::F64).unwrap_err();
    assert!(e.is_input(), "{e}");
    assert!(e.to_string().contains("Z=100"), "{e}");
}
