//! Forward memory of imported models: the run releases each value after
//! its last use, so the engine's tape holds fewer bytes at its peak than
//! the same model recorded with release switched off, with the same bits
//! for the energy, forces and strain derivative.

use ddmlip_engine::{Graph, LiveStats, ModelForward, ModelInfo, ModelInputs, RowDomain, Tensor};
use ddmlip_pt2::ImportedModel;
use std::path::PathBuf;
use std::sync::Arc;

fn model(name: &str) -> ImportedModel {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(format!("{name}.pt2"));
    ImportedModel::load(path).unwrap()
}

/// A jittered 3×3×3 grid cluster (spacing 1.9 Å) of the model's species.
fn cluster(species: &[u32]) -> (Vec<f64>, Vec<u32>) {
    let mut positions = Vec::new();
    let mut numbers = Vec::new();
    let mut k = 0usize;
    for x in 0..3 {
        for y in 0..3 {
            for z in 0..3 {
                let jitter = |s: usize| ((k * 7 + s * 13) % 11) as f64 * 0.02 - 0.1;
                positions.extend([
                    x as f64 * 1.9 + jitter(0),
                    y as f64 * 1.9 + jitter(1),
                    z as f64 * 1.9 + jitter(2),
                ]);
                numbers.push(species[k % species.len()]);
                k += 1;
            }
        }
    }
    (positions, numbers)
}

struct TapeRun {
    energy: Vec<f64>,
    forces: Vec<f64>,
    strain_grad: Vec<f64>,
    stats: LiveStats,
}

/// One evaluation on a graph built by hand (what the runtime does for a
/// single process): strained positions and cell, every ordered pair within
/// the cutoff, the model, then ∂E/∂r and ∂E/∂ε.
fn run_on_tape(model: &ImportedModel, release: bool) -> TapeRun {
    let species = match model.species() {
        ddmlip_engine::SpeciesSupport::Listed(s) => s,
        other => panic!("species {other:?}"),
    };
    let (pos, numbers) = cluster(&species);
    let n = numbers.len();
    let mut g = Graph::<f64>::new();
    g.set_release(release);
    g.enable_live_stats();
    let positions = g.leaf(pos.clone(), n, 3, RowDomain::Atom);
    let strain = g.leaf(vec![0.0; 9], 1, 9, RowDomain::System);
    let cell = g.constant(
        vec![20.0, 0.0, 0.0, 0.0, 20.0, 0.0, 0.0, 0.0, 20.0],
        3,
        3,
        RowDomain::System,
    );
    let atom_system = g
        .index(
            Arc::new(vec![0; n]),
            RowDomain::Atom,
            RowDomain::System,
            1,
            "atom_system",
        )
        .unwrap();
    let cell_system = g
        .index(
            Arc::new(vec![0; 3]),
            RowDomain::System,
            RowDomain::System,
            1,
            "cell_system",
        )
        .unwrap();
    let pos_s = g.apply_strain(positions, strain, atom_system).unwrap();
    let cell_s = g.apply_strain(cell, strain, cell_system).unwrap();
    let cutoff = model.cutoff();
    let (mut centers, mut neighbors) = (Vec::new(), Vec::new());
    for i in 0..n {
        for j in 0..n {
            let d2: f64 = (0..3)
                .map(|c| (pos[3 * j + c] - pos[3 * i + c]).powi(2))
                .sum();
            if i != j && d2 < cutoff * cutoff {
                centers.push(i as u32);
                neighbors.push(j as u32);
            }
        }
    }
    let n_edges = centers.len();
    let index = |g: &mut Graph<f64>, v: Vec<u32>, target, rows, role| {
        g.index(Arc::new(v), RowDomain::Edge, target, rows, role)
            .unwrap()
    };
    let c = index(&mut g, centers, RowDomain::Atom, n, "edge_center");
    let nb = index(&mut g, neighbors, RowDomain::Atom, n, "edge_neighbor");
    let es = index(
        &mut g,
        vec![0; n_edges],
        RowDomain::System,
        1,
        "edge_system",
    );
    let edges = g.edges(pos_s, c, nb, es, None).unwrap();
    let inputs = ModelInputs {
        positions: pos_s,
        cell: cell_s,
        numbers: Arc::new(numbers),
        atom_system,
        n_systems: 1,
        pbc: vec![[false; 3]],
        edges: Some(edges),
    };
    let out = model.forward(&mut g, &inputs).unwrap();
    let leaves: [Tensor; 2] = [positions, strain];
    let grads = g.grad(out.energy, None, &leaves).unwrap();
    TapeRun {
        energy: g.try_value(out.energy).unwrap().to_vec(),
        forces: grads[0].iter().map(|x| -x).collect(),
        strain_grad: grads[1].clone(),
        stats: g.live_stats().unwrap().clone(),
    }
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check(name: &str) {
    let m = model(name);
    let kept = run_on_tape(&m, false);
    let released = run_on_tape(&m, true);
    assert!(
        kept.forces.iter().any(|&f| f != 0.0),
        "{name}: no force at all"
    );
    assert_eq!(bits(&released.energy), bits(&kept.energy), "{name}: energy");
    assert_eq!(bits(&released.forces), bits(&kept.forces), "{name}: forces");
    assert_eq!(
        bits(&released.strain_grad),
        bits(&kept.strain_grad),
        "{name}: strain derivative"
    );
    let (with, without) = (released.stats.peak_bytes, kept.stats.peak_bytes);
    eprintln!(
        "{name}: peak live tape bytes {with} released / {without} kept ({:.2}); \
         released peak in backward: {}; largest at the peak: {:?}",
        with as f64 / without as f64,
        released.stats.peak_in_backward,
        &released.stats.peak_by_op[..released.stats.peak_by_op.len().min(8)]
    );
    eprintln!(
        "{name}: kept peak by op: {:?}",
        &kept.stats.peak_by_op[..kept.stats.peak_by_op.len().min(8)]
    );
    assert!(
        with < without,
        "{name}: releasing did not lower the peak ({with} vs {without} bytes)"
    );
}

#[test]
fn nequip_peak_tape_bytes_drop_with_the_same_bits() {
    check("nequip");
}

#[test]
fn allegro_peak_tape_bytes_drop_with_the_same_bits() {
    check("allegro");
}

#[test]
fn mace_peak_tape_bytes_drop_with_the_same_bits() {
    check("mace");
}
