//! GPU against CPU: the neighbour list (identical `(i, j, S)` lists) and
//! Lennard-Jones (f64 to 1e-10 relative, f32 within a stated tolerance),
//! plus determinism. These need an NVIDIA GPU and run only with
//! `DDMLIP_GPU_TESTS=1` (`scripts/gpu-check.sh` sets it); otherwise each
//! test prints `SKIPPED` and returns.

use ddmlip::{evaluate, EvalOptions, Model};
use ddmlip_atoms::{Cell, System};
use ddmlip_cuda::{evaluate_lj, CudaDevice, GpuNeighborList, LjParameters, Precision};
use ddmlip_models::LennardJones;
use ddmlip_neighbors::{neighbor_list, NeighborOptions};
use ddmlip_testkit::build::{self, SplitMix64};

mod common;
use common::{fixture_frames, gpu};

/// f32 tolerances against the CPU f64 run, relative to the largest
/// magnitude of each quantity: energies 1e-5, forces and stress 1e-4.
const F32_ENERGY_TOL: f64 = 1e-5;
const F32_FORCE_TOL: f64 = 1e-4;

/// Random systems: triclinic and skewed cells, cells smaller than the
/// cutoff, slabs, wires and open clusters, positions outside the cell.
fn random_systems() -> Vec<(System, f64)> {
    let mut rng = SplitMix64::new(2412);
    let mut u = |lo: f64, hi: f64| lo + (hi - lo) * 0.5 * (rng.uniform() + 1.0);
    let mut out = Vec::new();
    let pbcs = [
        [true; 3],
        [true, true, false],
        [false, true, true],
        [true, false, false],
        [false; 3],
    ];
    for case in 0..40 {
        let pbc = pbcs[case % pbcs.len()];
        let tiny = case % 7 == 3;
        let (lo, hi) = if tiny { (1.0, 2.5) } else { (4.0, 14.0) };
        let (a, b, c) = (u(lo, hi), u(lo, hi), u(lo, hi));
        let skew = if case % 3 == 0 { 0.0 } else { 1.2 };
        let m = [
            [a, 0.0, 0.0],
            [skew * u(-1.0, 1.0) * a, b, 0.0],
            [skew * u(-1.0, 1.0) * a, skew * u(-1.0, 1.0) * b, c],
        ];
        let cell = Cell::new(m);
        let n_atoms = if tiny { 3 } else { 10 + (case * 13) % 90 };
        let positions = (0..n_atoms)
            .map(|_| cell.to_cartesian([u(-0.7, 1.8), u(-0.7, 1.8), u(-0.7, 1.8)]))
            .collect();
        let cutoff = u(2.0, 6.0);
        let cell = (pbc.iter().any(|&p| p) || case % 2 == 0).then_some(cell);
        out.push((System::new(positions, vec![18; n_atoms], cell, pbc), cutoff));
    }
    out
}

fn cpu_triples(system: &System, cutoff: f64) -> Vec<(u32, u32, [i32; 3])> {
    let list = neighbor_list(
        &system.positions,
        system.cell.as_ref(),
        system.pbc,
        &NeighborOptions {
            cutoff,
            half: false,
        },
    )
    .unwrap();
    (0..list.len())
        .map(|p| (list.centers[p], list.neighbors[p], list.shifts[p]))
        .collect()
}

#[test]
fn gpu_neighbour_list_equals_the_cpu_list() {
    let Some(dev) = gpu() else { return };
    let mut cases: Vec<(System, f64)> = fixture_frames()
        .into_iter()
        .flat_map(|s| [(s.clone(), 5.0), (s, 2.5)])
        .collect();
    cases.extend(random_systems());
    let mut pairs = 0;
    for (k, (system, cutoff)) in cases.iter().enumerate() {
        let list = GpuNeighborList::build(&dev, system, *cutoff).unwrap();
        let gpu = list.to_host(&dev).unwrap();
        let cpu = cpu_triples(system, *cutoff);
        assert_eq!(gpu.len(), cpu.len(), "case {k}: pair count");
        assert!(gpu == cpu, "case {k}: pairs differ (pbc {:?})", system.pbc);
        pairs += cpu.len();
    }
    assert!(
        pairs > 10_000,
        "the cases should have many pairs, got {pairs}"
    );
    eprintln!(
        "{} systems, {pairs} pairs: GPU list == CPU list",
        cases.len()
    );
}

#[test]
fn gpu_neighbour_list_is_the_same_every_run() {
    let Some(dev) = gpu() else { return };
    let system = build::rattled_silicon(6);
    let first = GpuNeighborList::build(&dev, &system, 5.0)
        .unwrap()
        .to_host(&dev)
        .unwrap();
    for _ in 0..3 {
        let again = GpuNeighborList::build(&dev, &system, 5.0)
            .unwrap()
            .to_host(&dev)
            .unwrap();
        assert!(again == first);
    }
}

fn argon_crystal(n: usize, seed: u64) -> System {
    let mut s = build::fcc(18, 5.3, n);
    build::rattle_uniform(&mut s, 0.15, seed);
    s
}

fn max_abs(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(0.0, |m, x| m.max(x.abs()))
}

struct Errors {
    energy: f64,
    atomic: f64,
    forces: f64,
    stress: f64,
}

/// Largest deviations of the GPU result from the CPU f64 run, each relative
/// to the largest magnitude of that quantity.
fn compare(
    model: &LennardJones,
    system: &System,
    precision: Precision,
    dev: &CudaDevice,
) -> Errors {
    let params = LjParameters {
        epsilon: model.epsilon,
        sigma: model.sigma,
        cutoff: model.cutoff,
        shift: model.shift,
    };
    let gpu = evaluate_lj(dev, system, &params, precision).unwrap();
    let boxed: Box<dyn Model> = Box::new(model.clone());
    let cpu = evaluate(
        boxed.as_ref(),
        std::slice::from_ref(system),
        &EvalOptions::default(),
    )
    .unwrap();
    let e_cpu = cpu.energy().expect("energy output")[0];
    let atomic_cpu = cpu.atomic_energies().unwrap();
    let f_cpu = cpu.forces().expect("forces output");
    let energy = (gpu.energy - e_cpu).abs() / e_cpu.abs().max(max_abs(atomic_cpu.iter().copied()));
    let atomic = max_abs(
        gpu.atomic_energies
            .iter()
            .zip(atomic_cpu)
            .map(|(a, b)| a - b),
    ) / max_abs(atomic_cpu.iter().copied());
    let forces = max_abs(
        gpu.forces
            .iter()
            .zip(&f_cpu)
            .flat_map(|(a, b)| (0..3).map(move |k| a[k] - b[k])),
    ) / max_abs(f_cpu.iter().flatten().copied());
    let stress = match (gpu.stress, cpu.stress().and_then(|s| s[0])) {
        (Some(g), Some(c)) => max_abs((0..6).map(|k| g[k] - c[k])) / max_abs(c.iter().copied()),
        (None, None) => 0.0,
        (g, c) => panic!("stress presence differs: GPU {g:?}, CPU {c:?}"),
    };
    Errors {
        energy,
        atomic,
        forces,
        stress,
    }
}

fn lj_cases() -> Vec<(LennardJones, System)> {
    let unshifted = LennardJones {
        shift: false,
        ..LennardJones::argon()
    };
    let short = LennardJones {
        epsilon: 0.0104,
        sigma: 3.4,
        cutoff: 6.5,
        shift: true,
    };
    let mut slab = argon_crystal(3, 7);
    slab.pbc = [true, true, false];
    let mut cluster = argon_crystal(2, 8);
    cluster.pbc = [false; 3];
    cluster.cell = None;
    vec![
        (LennardJones::argon(), argon_crystal(4, 1)),
        (unshifted, argon_crystal(3, 2)),
        (short.clone(), argon_crystal(5, 3)),
        (LennardJones::argon(), slab),
        (short, cluster),
        (LennardJones::argon(), build::demo_copper(3)),
    ]
}

#[test]
fn gpu_lj_f64_equals_the_cpu_run_to_1e_10() {
    let Some(dev) = gpu() else { return };
    for (k, (model, system)) in lj_cases().iter().enumerate() {
        let e = compare(model, system, Precision::F64, &dev);
        eprintln!(
            "lj f64 case {k} ({} atoms): energy {:.1e} atomic {:.1e} forces {:.1e} stress {:.1e}",
            system.positions.len(),
            e.energy,
            e.atomic,
            e.forces,
            e.stress
        );
        for (what, err) in [
            ("energy", e.energy),
            ("atomic", e.atomic),
            ("forces", e.forces),
            ("stress", e.stress),
        ] {
            assert!(err <= 1e-10, "case {k}: {what} differs by {err:e} relative");
        }
    }
}

#[test]
fn gpu_lj_f32_is_within_its_tolerance_of_cpu_f64() {
    let Some(dev) = gpu() else { return };
    for (k, (model, system)) in lj_cases().iter().enumerate() {
        let e = compare(model, system, Precision::F32, &dev);
        eprintln!(
            "lj f32 case {k} ({} atoms): energy {:.1e} atomic {:.1e} forces {:.1e} stress {:.1e}",
            system.positions.len(),
            e.energy,
            e.atomic,
            e.forces,
            e.stress
        );
        assert!(
            e.energy <= F32_ENERGY_TOL,
            "case {k}: energy {:e}",
            e.energy
        );
        assert!(
            e.atomic <= F32_ENERGY_TOL * 10.0,
            "case {k}: atomic {:e}",
            e.atomic
        );
        assert!(e.forces <= F32_FORCE_TOL, "case {k}: forces {:e}", e.forces);
        assert!(e.stress <= F32_FORCE_TOL, "case {k}: stress {:e}", e.stress);
    }
}

#[test]
fn gpu_lj_gives_the_same_bits_every_run() {
    let Some(dev) = gpu() else { return };
    let system = argon_crystal(6, 9);
    let p = LennardJones::argon();
    let params = LjParameters {
        epsilon: p.epsilon,
        sigma: p.sigma,
        cutoff: p.cutoff,
        shift: p.shift,
    };
    for precision in [Precision::F64, Precision::F32] {
        let first = evaluate_lj(&dev, &system, &params, precision).unwrap();
        for _ in 0..3 {
            let again = evaluate_lj(&dev, &system, &params, precision).unwrap();
            assert_eq!(again.energy.to_bits(), first.energy.to_bits());
            assert!(again.forces == first.forces && again.stress == first.stress);
        }
    }
}

#[test]
fn gpu_errors_are_typed() {
    let Some(dev) = gpu() else { return };
    let empty = System::new(vec![], vec![], None, [false; 3]);
    let e = GpuNeighborList::build(&dev, &empty, 5.0).unwrap_err();
    assert!(e.to_string().contains("no atoms"), "{e}");
    let nan = System::new(vec![[f64::NAN, 0.0, 0.0]], vec![18], None, [false; 3]);
    let e = GpuNeighborList::build(&dev, &nan, 5.0).unwrap_err();
    assert!(e.to_string().contains("non-finite"), "{e}");
    let e = CudaDevice::open(1000).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}

/// Timings for the report: GPU neighbour list and Lennard-Jones at about
/// 100k atoms (run by scripts/gpu-check.sh; prints, asserts only success).
#[test]
fn gpu_lj_timing_100k_atoms() {
    let Some(dev) = gpu() else { return };
    let system = argon_crystal(29, 10); // 4·29³ = 97,556 atoms
    let p = LennardJones::argon();
    let params = LjParameters {
        epsilon: p.epsilon,
        sigma: p.sigma,
        cutoff: p.cutoff,
        shift: p.shift,
    };
    for precision in [Precision::F64, Precision::F32] {
        let _warm = evaluate_lj(&dev, &system, &params, precision).unwrap();
        let mut best = (f64::INFINITY, f64::INFINITY);
        for _ in 0..5 {
            let r = evaluate_lj(&dev, &system, &params, precision).unwrap();
            best.0 = best.0.min(r.timings.neighbors_s);
            best.1 = best.1.min(r.timings.model_s);
        }
        eprintln!(
            "TIMING lj {precision:?} {} atoms: neighbour list {:.2} ms, model {:.2} ms (best of 5)",
            system.positions.len(),
            best.0 * 1e3,
            best.1 * 1e3
        );
    }
    let boxed: Box<dyn Model> = Box::new(p);
    for dtype in [ddmlip::DType::F64, ddmlip::DType::F32] {
        let opts = EvalOptions {
            dtype,
            ..Default::default()
        };
        let one = std::slice::from_ref(&system);
        let _warm = evaluate(boxed.as_ref(), one, &opts).unwrap();
        let start = std::time::Instant::now();
        let _ = evaluate(boxed.as_ref(), one, &opts).unwrap();
        eprintln!(
            "TIMING lj CPU {dtype} {} atoms, {} threads: {:.2} ms (neighbour list + model)",
            system.positions.len(),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}
