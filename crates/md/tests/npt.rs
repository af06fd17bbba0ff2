//! Constant-pressure MD (stochastic cell rescaling with a Langevin
//! thermostat): decomposed runs against the single-process run, the mean
//! pressure against its target, a full-cell run on a sheared cell, and
//! bitwise restarts.

mod common;

use common::*;
use ddmlip_atoms::Cell;
use ddmlip_md::{maxwell_boltzmann, CellDof, Ensemble, MdConfig, StartState, Topology};
use ddmlip_models::load_model;

fn npt(pressure_gpa: f64, cell_dof: CellDof) -> Ensemble {
    Ensemble::Npt {
        temperature: 40.0,
        tdamp_fs: 100.0,
        pressure_gpa,
        pdamp_fs: 300.0,
        compressibility_per_gpa: 0.3,
        cell_dof,
    }
}

/// Argon FCC (`n`³ cells of `a` Å, rattled) deformed by `shear` (row vectors:
/// r' = r·S), with momenta at 40 K.
fn crystal(n: usize, a: f64, shear: [[f64; 3]; 3]) -> (Topology, StartState) {
    let (pos, cell) = fcc_argon(n, a, 0.05);
    let apply = |v: &[f64; 3]| {
        [0, 1, 2].map(|b| v[0] * shear[0][b] + v[1] * shear[1][b] + v[2] * shear[2][b])
    };
    let pos: Vec<[f64; 3]> = pos.iter().map(apply).collect();
    let cell = Cell::new(cell.matrix.map(|r| apply(&r)));
    let topo = argon_topology(pos.len());
    let p = maxwell_boltzmann(&topo.masses, 40.0, 9);
    (topo, StartState::fresh(cell, pos, p))
}

const IDENTITY: [[f64; 3]; 3] = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
const SHEAR: [[f64; 3]; 3] = [[1.0, 0.0, 0.0], [0.12, 1.0, 0.0], [0.05, -0.08, 1.0]];

/// Largest distance between two position sets up to lattice translations of
/// `cell` (any cell shape).
fn max_periodic_distance(a: &[[f64; 3]], b: &[[f64; 3]], cell: &Cell) -> f64 {
    let h = cell.matrix;
    let inv = cell.inverse().unwrap();
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = [x[0] - y[0], x[1] - y[1], x[2] - y[2]];
            let f = [0, 1, 2].map(|k| d[0] * inv[0][k] + d[1] * inv[1][k] + d[2] * inv[2][k]);
            let f = f.map(|v| v - v.round());
            let c = [0, 1, 2].map(|k| f[0] * h[0][k] + f[1] * h[1][k] + f[2] * h[2][k]);
            (c[0] * c[0] + c[1] * c[1] + c[2] * c[2]).sqrt()
        })
        .fold(0.0, f64::max)
}

fn max_rel_cell_diff(a: &Cell, b: &Cell) -> f64 {
    let scale = a
        .matrix
        .iter()
        .flatten()
        .fold(0.0f64, |m, x| m.max(x.abs()));
    a.matrix
        .iter()
        .flatten()
        .zip(b.matrix.iter().flatten())
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0.0, f64::max)
}

/// Isotropic and full-cell NPT on 2 and 4 ranks follow the one-rank
/// trajectory (positions, momenta, cell) over 300 steps.
#[test]
fn decomposed_npt_equals_single_process() {
    let model = load_model("lj").unwrap();
    for (cell_dof, shear) in [(CellDof::Iso, IDENTITY), (CellDof::Full, SHEAR)] {
        let (topo, start) = crystal(3, 5.1, shear);
        let mut config = MdConfig::new(npt(0.0, cell_dof), 5.0, 300);
        config.seed = 4;
        config.skin = 0.5;
        config.final_frame = true;
        let (_, one) = run(model.as_ref(), &topo, &start, &config, 1);
        let one = one.last.unwrap();
        let dv = (one.cell.volume() - start.cell.volume()).abs() / start.cell.volume();
        assert!(dv > 1e-3, "{cell_dof:?}: the volume did not move ({dv:e})");
        for ranks in [2, 4] {
            let (_, got) = run(model.as_ref(), &topo, &start, &config, ranks);
            let got = got.last.unwrap();
            let dx = max_periodic_distance(&got.positions, &one.positions, &one.cell);
            let dp = max_abs_diff(&got.momenta, &one.momenta);
            let dh = max_rel_cell_diff(&one.cell, &got.cell);
            eprintln!("{cell_dof:?} {ranks} ranks: |Δr| {dx:e} Å, |Δp| {dp:e}, cell {dh:e}");
            assert!(
                dx < 1e-8,
                "{cell_dof:?} on {ranks} ranks: positions differ by {dx:e} Å"
            );
            assert!(
                dp < 1e-8,
                "{cell_dof:?} on {ranks} ranks: momenta differ by {dp:e}"
            );
            assert!(
                dh < 1e-10,
                "{cell_dof:?} on {ranks} ranks: cell differs by {dh:e}"
            );
        }
    }
}

/// A compressed crystal under a 0 GPa target expands, and after
/// equilibration the mean pressure is within four block standard errors of
/// the target.
#[test]
fn npt_reaches_target_pressure() {
    let model = load_model("lj").unwrap();
    let (topo, start) = crystal(3, 5.05, IDENTITY);
    let target = 0.05;
    let mut config = MdConfig::new(npt(target, CellDof::Iso), 5.0, 2400);
    config.seed = 21;
    config.skin = 0.5;
    config.thermo_every = 1;
    let (_, out) = run(model.as_ref(), &topo, &start, &config, 2);
    let p0 = out.thermo[0].pressure_gpa.unwrap();
    assert!(p0 > 0.3, "the start is not compressed: {p0} GPa");
    let prod: Vec<_> = out.thermo[800..].iter().collect();
    let v_mean = prod.iter().map(|r| r.volume.unwrap()).sum::<f64>() / prod.len() as f64;
    let v0 = start.cell.volume();
    assert!(v_mean > 1.02 * v0, "volume {v_mean} did not grow from {v0}");
    let pressures: Vec<f64> = prod.iter().map(|r| r.pressure_gpa.unwrap()).collect();
    let blocks = 8;
    let len = pressures.len() / blocks;
    let means: Vec<f64> = pressures
        .chunks_exact(len)
        .map(|c| c.iter().sum::<f64>() / len as f64)
        .collect();
    let mean = means.iter().sum::<f64>() / blocks as f64;
    let var = means.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (blocks - 1) as f64;
    let se = (var / blocks as f64).sqrt();
    eprintln!("start {p0:.3} GPa, mean {mean:.4} ± {se:.4} GPa, V {v0:.1} -> {v_mean:.1} Å³");
    assert!(
        (mean - target).abs() < 4.0 * se.max(2e-3),
        "mean pressure {mean} GPa ± {se} vs target {target}"
    );
}

/// A full-cell run on a sheared (triclinic) crystal keeps a valid cell and
/// relaxes the shear stress the shape deformation puts in; an isotropic run
/// cannot.
#[test]
fn full_cell_npt_relaxes_shear_on_a_triclinic_cell() {
    let model = load_model("lj").unwrap();
    let (topo, start) = crystal(3, 5.3, SHEAR);
    let shear_stress = |s: [f64; 6]| s[3].abs().max(s[4].abs()).max(s[5].abs());
    let mut means = Vec::new();
    for cell_dof in [CellDof::Iso, CellDof::Full] {
        let mut config = MdConfig::new(npt(0.0, cell_dof), 5.0, 1200);
        config.seed = 2;
        config.skin = 0.5;
        config.frame_every = 10;
        let (_, out) = run(model.as_ref(), &topo, &start, &config, 2);
        let s0 = shear_stress(out.frames[0].stress.unwrap());
        let tail = &out.frames[out.frames.len() / 2..];
        let mean = tail
            .iter()
            .map(|f| shear_stress(f.stress.unwrap()))
            .sum::<f64>()
            / tail.len() as f64;
        for f in &out.frames {
            let v = f.cell.volume();
            assert!(
                v.is_finite() && v > 0.5 * start.cell.volume() && v < 2.0 * start.cell.volume(),
                "volume {v}"
            );
            let h = f.cell.matrix;
            for a in 0..3 {
                let b = (a + 1) % 3;
                let dot: f64 = (0..3).map(|k| h[a][k] * h[b][k]).sum();
                let na = (0..3).map(|k| h[a][k] * h[a][k]).sum::<f64>().sqrt();
                let nb = (0..3).map(|k| h[b][k] * h[b][k]).sum::<f64>().sqrt();
                let angle = (dot / (na * nb)).acos().to_degrees();
                assert!((45.0..135.0).contains(&angle), "cell angle {angle}°");
            }
        }
        eprintln!("{cell_dof:?}: shear stress {s0:e} -> mean {mean:e} eV/Å³");
        means.push((s0, mean));
    }
    let (s0, iso) = means[0];
    let (_, full) = means[1];
    assert!(s0 > 1e-4, "the shear put no stress in: {s0:e}");
    assert!(
        full < 0.3 * s0,
        "full cell kept the shear stress: {full:e} of {s0:e}"
    );
    assert!(full < 0.5 * iso, "full cell {full:e} vs iso {iso:e}");
}

/// A 2K-step NPT run equals K steps + restart from the checkpoint file + K
/// steps, bitwise, on the same rank count (cell included).
#[test]
fn npt_restart_continues_bitwise() {
    let model = load_model("lj").unwrap();
    for (cell_dof, shear) in [(CellDof::Iso, IDENTITY), (CellDof::Full, SHEAR)] {
        let (topo, start) = crystal(3, 5.1, shear);
        let mut config = MdConfig::new(npt(0.0, cell_dof), 5.0, 100);
        config.seed = 8;
        config.skin = 0.5;
        config.final_frame = true;
        config.final_checkpoint = true;
        let (_, whole) = run(model.as_ref(), &topo, &start, &config, 3);
        let whole = whole.last.unwrap();
        let mut half = config.clone();
        half.steps = 50;
        let (_, first) = run(model.as_ref(), &topo, &start, &half, 3);
        let ck = first.checkpoints.last().unwrap().clone();
        let dir = std::env::temp_dir().join(format!("ddmlip-npt-restart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ck.json");
        ck.write(&path).unwrap();
        let ck = ddmlip_md::Checkpoint::read(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let resumed = StartState::from_checkpoint(&ck, &topo).unwrap();
        let (_, second) = run(model.as_ref(), &topo, &resumed, &half, 3);
        let second = second.last.unwrap();
        assert_eq!(second.step, 100);
        assert_eq!(second.cell.matrix, whole.cell.matrix, "{cell_dof:?}: cell");
        assert_eq!(second.positions, whole.positions, "{cell_dof:?}: positions");
        assert_eq!(second.momenta, whole.momenta, "{cell_dof:?}: momenta");
    }
}

/// NPT without a periodic cell, and a non-positive --pdamp, are input errors.
#[test]
fn npt_rejects_bad_input() {
    let model = load_model("lj").unwrap();
    let (mut topo, start) = crystal(2, 5.26, IDENTITY);
    let config = MdConfig::new(npt(0.0, CellDof::Iso), 5.0, 1);
    topo.pbc = [true, true, false];
    let err = ddmlip_md::run_threads(
        model.as_ref(),
        &topo,
        &start,
        &config,
        1,
        &mut Collect::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ddmlip_md::MdError::Input(_)), "{err}");
    assert!(err.to_string().contains("--ensemble npt"), "{err}");
    let mut bad = config.clone();
    bad.ensemble = Ensemble::Npt {
        temperature: 40.0,
        tdamp_fs: 100.0,
        pressure_gpa: 0.0,
        pdamp_fs: 0.0,
        compressibility_per_gpa: 0.3,
        cell_dof: CellDof::Iso,
    };
    let err = bad.check().unwrap_err();
    assert!(err.to_string().contains("--pdamp"), "{err}");
}
