//! Decomposed runs on one GPU (`--ranks N --device cuda`) against the
//! one-rank GPU run: Lennard-Jones and SevenNet-0, f64 to 1e-10 relative
//! (energy, per-atom energies, forces, stress) over 2, 3, 4 and 8 ranks,
//! periodic, slab and cluster systems, ranks that own nothing, cells
//! thinner than the halo; f32 within the f32 path's contract against f64
//! (Lennard-Jones) or 1e-5 of the one-rank f32 run (SevenNet-0); the same
//! bits on a second run.
//! These need an NVIDIA GPU and run only with `DDMLIP_GPU_TESTS=1`
//! (`scripts/gpu-check.sh`); otherwise each test prints `SKIPPED`.

use ddmlip_atoms::{Cell, System};
use ddmlip_cuda::{
    evaluate_decomposed, evaluate_on_gpus, CudaDevice, GpuModel, GpuPlacement, LjParameters,
    Precision,
};
use ddmlip_testkit::build;

mod common;
use common::{assert_within, check_split as check, deviations, fixture_frames, gpu, TIMEOUT};

fn argon(n: usize, seed: u64) -> System {
    let mut s = build::fcc(18, 5.3, n);
    build::rattle_uniform(&mut s, 0.15, seed);
    s
}

fn lj() -> GpuModel {
    GpuModel::Lj(LjParameters {
        epsilon: 0.0104,
        sigma: 3.4,
        cutoff: 10.2,
        shift: true,
    })
}

/// Periodic, slab, cluster, a cell thinner than the halo, and atoms in one
/// half of a long cell (ranks over the empty half own nothing).
fn lj_systems() -> Vec<(&'static str, System)> {
    let mut slab = argon(3, 2);
    slab.pbc = [true, true, false];
    let mut cluster = argon(3, 3);
    cluster.pbc = [false; 3];
    cluster.cell = None;
    let thin = argon(2, 4);
    let mut half = argon(3, 5);
    if let Some(c) = half.cell {
        let mut m = c.matrix;
        m[0] = [3.0 * m[0][0], 3.0 * m[0][1], 3.0 * m[0][2]];
        half.cell = Some(Cell::new(m));
    }
    vec![
        ("bulk", argon(4, 1)),
        ("slab", slab),
        ("cluster", cluster),
        ("thin cell", thin),
        ("half-empty cell", half),
    ]
}

#[test]
fn split_lennard_jones_equals_one_rank_in_f64() {
    let Some(dev) = gpu() else { return };
    let model = lj();
    for (what, sys) in lj_systems() {
        check(
            &dev,
            &model,
            &sys,
            Precision::F64,
            &[2, 3, 4, 8],
            1e-10,
            what,
        );
    }
}

/// f32 splits are held to the f32 path's own contract against f64 (the
/// one-rank f32 run's tolerances in `tests/gpu.rs`: energy 1e-5, per-atom
/// energies, forces and stress 1e-4 relative). Two f32 runs that add the
/// same ~250 pair terms per atom in different orders, from positions
/// rounded after different image shifts, differ by about as much as each
/// differs from f64, so the split is compared with f64, not with the
/// one-rank f32 run's bits.
#[test]
fn split_lennard_jones_in_f32_keeps_the_f32_contract() {
    let Some(dev) = gpu() else { return };
    let model = lj();
    for (what, sys) in lj_systems() {
        let exact = model.evaluate(&dev, &sys, Precision::F64).unwrap();
        let one = deviations(&exact, &model.evaluate(&dev, &sys, Precision::F32).unwrap());
        for r in [2, 4] {
            let split = evaluate_decomposed(&model, &dev, &sys, Precision::F32, r, TIMEOUT)
                .unwrap_or_else(|e| panic!("{what}, {r} ranks: {e}"));
            let d = deviations(&exact, &split.output);
            eprintln!(
                "{what} ({} atoms), {r} ranks, f32 vs f64: energy {:.1e} atomic {:.1e} forces {:.1e} stress {:.1e} (one rank: {:.1e} {:.1e} {:.1e} {:.1e})",
                sys.len(), d[0], d[1], d[2], d[3], one[0], one[1], one[2], one[3]
            );
            assert_within(
                d,
                [1e-5, 1e-4, 1e-4, 1e-4],
                &format!("{what}, {r} ranks, f32 against f64"),
            );
        }
    }
}

fn sevennet(dev: &CudaDevice, p: Precision) -> GpuModel {
    GpuModel::sevennet(dev, &ddmlip_testkit::sevennet_checkpoint(), None, p).unwrap()
}

#[test]
fn split_sevennet_equals_one_rank_on_the_fixture_frames() {
    let Some(dev) = gpu() else { return };
    let model = sevennet(&dev, Precision::F64);
    let mut worst = 0.0f64;
    for (k, sys) in fixture_frames().iter().enumerate() {
        let what = format!("sevennet-0 fixture frame {k}");
        worst = worst.max(check(
            &dev,
            &model,
            sys,
            Precision::F64,
            &[2, 3, 4, 8],
            1e-10,
            &what,
        ));
    }
    eprintln!("sevennet-0 split vs one rank, f64: worst {worst:.1e} relative");
}

#[test]
fn split_sevennet_on_rattled_silicon_in_f64_and_f32() {
    let Some(dev) = gpu() else { return };
    let mut si = build::diamond(14, 5.43, 4);
    build::rattle_uniform(&mut si, 0.1, 11);
    let f64_model = sevennet(&dev, Precision::F64);
    check(
        &dev,
        &f64_model,
        &si,
        Precision::F64,
        &[2, 4, 8],
        1e-10,
        "si 512 f64",
    );
    let f32_model = sevennet(&dev, Precision::F32);
    check(
        &dev,
        &f32_model,
        &si,
        Precision::F32,
        &[2, 4],
        1e-5,
        "si 512 f32",
    );
}

#[test]
fn a_split_run_gives_the_same_bits_every_time() {
    let Some(dev) = gpu() else { return };
    let mut si = build::diamond(14, 5.43, 3);
    build::rattle_uniform(&mut si, 0.1, 12);
    for (model, sys) in [(sevennet(&dev, Precision::F64), si), (lj(), argon(4, 6))] {
        let a = evaluate_decomposed(&model, &dev, &sys, Precision::F64, 4, TIMEOUT).unwrap();
        let b = evaluate_decomposed(&model, &dev, &sys, Precision::F64, 4, TIMEOUT).unwrap();
        assert_eq!(a.output.energy.to_bits(), b.output.energy.to_bits());
        assert_eq!(a.output.forces, b.output.forces);
        assert_eq!(a.output.stress, b.output.stress);
    }
}

#[test]
fn split_runs_refuse_bad_input_with_typed_errors() {
    let Some(dev) = gpu() else { return };
    let model = lj();
    let sys = argon(2, 7);
    let zero = evaluate_decomposed(&model, &dev, &sys, Precision::F64, 0, TIMEOUT).unwrap_err();
    assert!(
        zero.is_input() && zero.to_string().contains("at least 1"),
        "{zero}"
    );
    let empty = System::default();
    let none = evaluate_decomposed(&model, &dev, &empty, Precision::F64, 2, TIMEOUT).unwrap_err();
    assert!(
        none.is_input() && none.to_string().contains("no atoms"),
        "{none}"
    );
    // An element SevenNet-0 does not know fails on the rank that holds it;
    // the error is that rank's own, not its peers' report of its failure.
    let mut alien = build::diamond(14, 5.43, 2);
    alien.numbers[0] = 118;
    let e = evaluate_decomposed(
        &sevennet(&dev, Precision::F64),
        &dev,
        &alien,
        Precision::F64,
        2,
        TIMEOUT,
    )
    .unwrap_err();
    assert!(e.is_input() && e.to_string().contains("Z=118"), "{e}");
}

/// Ranks placed round-robin over several GPU handles, each with its own
/// copy of the model (two handles on this one GPU stand for two GPUs),
/// give the one-rank answer too.
#[test]
fn ranks_over_several_placements_equal_one_rank() {
    let Some(dev) = gpu() else { return };
    let index = dev.index();
    let other = CudaDevice::open(index).unwrap();
    let mut si = build::diamond(14, 5.43, 3);
    build::rattle_uniform(&mut si, 0.1, 13);
    let (m0, m1) = (
        sevennet(&dev, Precision::F64),
        sevennet(&other, Precision::F64),
    );
    let one = m0.evaluate(&dev, &si, Precision::F64).unwrap();
    let gpus = [
        GpuPlacement {
            device: &dev,
            model: &m0,
        },
        GpuPlacement {
            device: &other,
            model: &m1,
        },
    ];
    for ranks in [2, 3, 4] {
        let split = evaluate_on_gpus(&gpus, &si, Precision::F64, ranks, TIMEOUT).unwrap();
        let d = deviations(&one, &split.output);
        eprintln!("si 216 over 2 placements, {ranks} ranks: {d:?}");
        assert!(d.iter().all(|&e| e <= 1e-10), "{ranks} ranks: {d:?}");
        assert_eq!(split.ranks.len(), ranks);
    }
}
