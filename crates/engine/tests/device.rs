//! The engine's device paths (`Graph::set_device`) on the reference device:
//! a SchNet-like model whose ops run partly on the device and partly on the
//! host gives the host-only graph's energy, gradients and trace.

use ddmlip_engine::device::ReferenceDevice;
use ddmlip_engine::ops::{Radial, Unary};
use ddmlip_engine::{Graph, Phase, RowDomain, Tensor, Trace};
use std::sync::Arc;

/// Deterministic pseudo-random numbers in [-1, 1).
fn rand_vec(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// Atoms of two systems in a 6 Å box, every pair within 4 Å an edge (both
/// directions, centres not sorted so scatters go through a permutation).
struct Problem {
    positions: Vec<f64>,
    species: Vec<u32>,
    system: Vec<u32>,
    centers: Vec<u32>,
    neighbors: Vec<u32>,
}

fn problem(n: usize, seed: u64) -> Problem {
    let positions: Vec<f64> = rand_vec(3 * n, seed).iter().map(|x| 3.0 * x).collect();
    let species = rand_vec(n, seed + 1)
        .iter()
        .map(|x| ((x + 1.0) * 1.5) as u32)
        .collect();
    let system = (0..n as u32)
        .map(|i| u32::from(i >= n as u32 / 2))
        .collect();
    let (mut centers, mut neighbors) = (Vec::new(), Vec::new());
    for j in 0..n {
        for i in 0..n {
            let d2: f64 = (0..3)
                .map(|k| (positions[3 * j + k] - positions[3 * i + k]).powi(2))
                .sum();
            if i != j && d2 < 16.0 && (i < n / 2) == (j < n / 2) {
                centers.push(i as u32);
                neighbors.push(j as u32);
            }
        }
    }
    Problem {
        positions,
        species,
        system,
        centers,
        neighbors,
    }
}

const F: usize = 8;
const K: usize = 6;

/// Energy per system and (∂E/∂positions, ∂E/∂filter weights), with the
/// graph for its trace. Host ops (edge lengths, a quotient, a column sum)
/// sit between device ops, so values and gradients cross both ways.
fn run(p: &Problem, device: Option<Arc<ReferenceDevice>>) -> (Vec<f64>, Vec<Vec<f64>>, Trace) {
    let n = p.species.len();
    let mut g = Graph::<f64>::new();
    g.enable_trace();
    if let Some(d) = device {
        g.set_device(d);
    }
    let pos = g.leaf(p.positions.clone(), n, 3, RowDomain::Atom);
    let filter_w = g.leaf(rand_vec(K * F, 7), K, F, RowDomain::None);
    let idx = |g: &mut Graph<f64>, v: &[u32], d, t, rows, role| {
        g.index(Arc::new(v.to_vec()), d, t, rows, role).unwrap()
    };
    let center = idx(
        &mut g,
        &p.centers,
        RowDomain::Edge,
        RowDomain::Atom,
        n,
        "edge_center",
    );
    let neighbor = idx(
        &mut g,
        &p.neighbors,
        RowDomain::Edge,
        RowDomain::Atom,
        n,
        "edge_neighbor",
    );
    let species = idx(
        &mut g,
        &p.species,
        RowDomain::Atom,
        RowDomain::None,
        3,
        "species",
    );
    let system = idx(
        &mut g,
        &p.system,
        RowDomain::Atom,
        RowDomain::System,
        2,
        "atom_system",
    );
    let lengths = g.edge_lengths(pos, center, neighbor, None).unwrap();
    let centers: Vec<f64> = (0..K).map(|k| 0.7 * k as f64).collect();
    let rbf = g
        .radial(
            lengths,
            Radial::Gaussian {
                centers,
                gamma: 0.8,
            },
        )
        .unwrap();
    let fc = g
        .radial(lengths, Radial::CosineCutoff { cutoff: 4.0 })
        .unwrap();
    let table = g.param(&rand_vec(3 * F, 11), 3, F).unwrap();
    let x = g.gather(table, species).unwrap();
    let bias = g.param(&rand_vec(F, 13), 1, F).unwrap();
    let filt = g.linear(rbf, filter_w, Some(bias)).unwrap();
    let filt = g.shifted_softplus(filt).unwrap();
    let filt = g.mul(filt, fc).unwrap();
    let w_in = g.param(&rand_vec(F * F, 17), F, F).unwrap();
    let xl = g.matmul(x, w_in).unwrap();
    let xj = g.gather(xl, neighbor).unwrap();
    let m = g.mul(xj, filt).unwrap();
    let agg = g.scatter_add(m, center).unwrap();
    let v = g.tanh(agg).unwrap();
    let v = g.sub(v, bias).unwrap();
    // Host ops reading device values, and device ops reading theirs.
    let two = g.param(&[2.0], 1, 1).unwrap();
    let v = g.div(v, two).unwrap();
    let x2 = g.add(x, v).unwrap();
    let sq = g.unary(x2, Unary::Square).unwrap();
    let atomic = g.sum_cols(sq).unwrap();
    let atomic = g.scale(atomic, 0.5).unwrap();
    let energy = g.segment_sum(atomic, system).unwrap();
    g.ensure_host(&[energy]).unwrap();
    let e = g.value(energy).to_vec();
    let grads = g.grad(energy, None, &[pos, filter_w]).unwrap();
    (e, grads, g.take_trace().unwrap())
}

fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-12 * scale,
            "{what}[{i}]: device {x} vs host {y}"
        );
    }
}

#[test]
fn a_model_split_between_device_and_host_gives_the_host_results() {
    let p = problem(40, 3);
    assert!(p.centers.len() > 200, "too few edges: {}", p.centers.len());
    let (e_host, g_host, _) = run(&p, None);
    let (e_dev, g_dev, _) = run(&p, Some(Arc::new(ReferenceDevice::new())));
    assert!(e_host.iter().all(|e| e.abs() > 1e-3), "energies {e_host:?}");
    close(&e_dev, &e_host, "energy");
    close(&g_dev[0], &g_host[0], "∂E/∂positions");
    close(&g_dev[1], &g_host[1], "∂E/∂filter weights");
    assert!(g_host[0].iter().any(|&x| x.abs() > 1e-6));
}

/// The device run's trace has the host run's events (ops, scopes, shapes,
/// domains, indices, sums); the events of ops with a device kernel name
/// the device, the others (a quotient, a column sum) none.
#[test]
fn a_device_run_traces_like_a_host_run() {
    let p = problem(30, 5);
    let (_, _, host) = run(&p, None);
    let (_, _, dev) = run(&p, Some(Arc::new(ReferenceDevice::new())));
    assert_eq!(host.events.len(), dev.events.len());
    let on_device = [
        "edge_lengths",
        "gaussian_basis",
        "cosine_cutoff",
        "gather",
        "matmul",
        "add",
        "sub",
        "mul",
        "shifted_softplus",
        "scatter_add",
        "tanh",
        "square",
        "scale",
        "segment_sum",
    ];
    let mut device_events = 0;
    for (h, d) in host.events.iter().zip(&dev.events) {
        assert_eq!(
            (&h.op, &h.scope, &h.inputs, &h.output, &h.indices, h.phase),
            (&d.op, &d.scope, &d.inputs, &d.output, &d.indices, d.phase)
        );
        let scale = h.owned_sum.abs().max(1.0);
        assert!(
            (h.owned_sum - d.owned_sum).abs() <= 1e-11 * scale,
            "{}: sum {} vs {}",
            h.op,
            h.owned_sum,
            d.owned_sum
        );
        assert_eq!(h.device, None);
        let base = d.op.trim_end_matches(".backward");
        let expect = on_device.contains(&base) && d.op != "leaf" && d.op != "constant";
        assert_eq!(
            d.device.is_some(),
            expect,
            "{} ({:?}) device {:?}",
            d.op,
            d.phase,
            d.device
        );
        device_events += usize::from(d.device.is_some() && d.phase == Phase::Forward);
    }
    assert!(
        device_events >= 15,
        "{device_events} forward events on the device"
    );
}

/// A chain of device ops keeps its values on the device: one upload of the
/// input, one download of the result, nothing in between, forward or
/// backward (the gradient of a host leaf comes back once).
#[test]
fn values_stay_on_the_device_between_device_ops() {
    let device = Arc::new(ReferenceDevice::new());
    let mut g = Graph::<f64>::new();
    g.set_device(device.clone());
    let x0 = rand_vec(64, 21);
    let x = g.leaf(x0.clone(), 16, 4, RowDomain::Atom);
    let mut y: Tensor = x;
    for k in 0..10 {
        y = g
            .unary(
                y,
                if k % 2 == 0 {
                    Unary::Tanh
                } else {
                    Unary::Scale(1.5)
                },
            )
            .unwrap();
    }
    assert_eq!((device.uploads(), device.downloads()), (1, 0));
    assert!(g.is_on_device(y));
    assert!(g.try_value(y).is_err(), "a device value read on the host");
    g.ensure_host(&[y]).unwrap();
    assert_eq!(device.downloads(), 1);
    let grads = g.grad(y, None, &[x]).unwrap();
    // The seed goes up once, the leaf's gradient comes down once.
    assert_eq!((device.uploads(), device.downloads()), (2, 2));
    // d/dx of the chain: the host formula, element by element.
    for (i, &x) in x0.iter().enumerate() {
        let (mut v, mut d) = (x, 1.0);
        for k in 0..10 {
            if k % 2 == 0 {
                v = v.tanh();
                d *= 1.0 - v * v;
            } else {
                v *= 1.5;
                d *= 1.5;
            }
        }
        assert!((grads[0][i] - d).abs() <= 1e-14 * d.abs().max(1.0));
        assert!((g.value(y)[i] - v).abs() <= 1e-15 * v.abs().max(1.0));
    }
}

/// A pair term finite at every length: `e^{−r/2}·(r² + 0.3) − 1/(r + 2)`,
/// with a constant on the left of a difference and of a product.
fn pair_term() -> ddmlip_engine::ops::Pointwise {
    let mut e = ddmlip_engine::ops::Pointwise::new("test_pair", 1);
    let r = e.input(0);
    let decay = e.unary(r, Unary::Scale(-0.5));
    let decay = e.unary(decay, Unary::Exp);
    let r2 = e.unary(r, Unary::Square);
    let c = e.constant(0.3);
    let r2 = e.add(c, r2);
    let bump = e.mul(decay, r2);
    let tail = e.unary(r, Unary::AddScalar(2.0));
    let tail = e.unary(tail, Unary::Recip);
    let half = e.constant(0.5);
    let tail = e.mul(half, tail);
    let one = e.constant(1.0);
    let shifted = e.sub(one, tail);
    e.sub(bump, shifted);
    e
}

/// Σ_i w_i · pair_sum_i over a periodic triclinic cell under strain: its
/// value and its gradients with respect to positions and strain.
fn pair_sum_run(device: bool) -> (f64, Vec<Vec<f64>>) {
    use ddmlip_engine::ops::PeriodicShifts;
    let n = 40;
    let cell = [7.5, 0.0, 0.0, 1.1, 7.9, 0.0, -0.7, 0.4, 8.2];
    let frac = rand_vec(3 * n, 31);
    let mut positions = vec![0.0; 3 * n];
    for a in 0..n {
        for k in 0..3 {
            positions[3 * a + k] = (0..3)
                .map(|m| 0.5 * (frac[3 * a + m] + 1.0) * cell[3 * m + k])
                .sum();
        }
    }
    let (mut centers, mut neighbors, mut shifts) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        for j in 0..n {
            for s in 0..27 {
                let shift = [s / 9 - 1, (s / 3) % 3 - 1, s % 3 - 1];
                if i == j && shift == [0, 0, 0] {
                    continue;
                }
                let d2: f64 = (0..3)
                    .map(|k| {
                        let image: f64 = (0..3).map(|m| shift[m] as f64 * cell[3 * m + k]).sum();
                        (positions[3 * j + k] + image - positions[3 * i + k]).powi(2)
                    })
                    .sum();
                if d2 < 16.0 {
                    centers.push(i as u32);
                    neighbors.push(j as u32);
                    shifts.push(shift);
                }
            }
        }
    }
    let n_edges = centers.len();
    let mut g = Graph::<f64>::new();
    if device {
        g.set_device(Arc::new(ReferenceDevice::new()));
    }
    let pos = g.leaf(positions, n, 3, RowDomain::Atom);
    let strain = g.leaf(
        rand_vec(9, 33).iter().map(|x| 0.01 * x).collect(),
        1,
        9,
        RowDomain::System,
    );
    let cell_t = g.constant(cell.to_vec(), 3, 3, RowDomain::System);
    let idx = |g: &mut Graph<f64>, v: Vec<u32>, d, t, rows, role| {
        g.index(Arc::new(v), d, t, rows, role).unwrap()
    };
    let atom_system = idx(
        &mut g,
        vec![0; n],
        RowDomain::Atom,
        RowDomain::System,
        1,
        "atom_system",
    );
    let cell_system = idx(
        &mut g,
        vec![0; 3],
        RowDomain::System,
        RowDomain::System,
        1,
        "cell_system",
    );
    let pos_s = g.apply_strain(pos, strain, atom_system).unwrap();
    let cell_s = g.apply_strain(cell_t, strain, cell_system).unwrap();
    let c = idx(
        &mut g,
        centers,
        RowDomain::Edge,
        RowDomain::Atom,
        n,
        "edge_center",
    );
    let nb = idx(
        &mut g,
        neighbors,
        RowDomain::Edge,
        RowDomain::Atom,
        n,
        "edge_neighbor",
    );
    let es = idx(
        &mut g,
        vec![0; n_edges],
        RowDomain::Edge,
        RowDomain::System,
        1,
        "edge_system",
    );
    let periodic = PeriodicShifts {
        cell: cell_s,
        shifts: Arc::new(shifts),
        edge_system: es,
    };
    let edges = g.edges(pos_s, c, nb, es, Some(periodic)).unwrap();
    let sums = g.pair_sum(&edges, &pair_term()).unwrap();
    assert_eq!(g.is_on_device(sums), device);
    let w = rand_vec(n, 35);
    g.ensure_host(&[sums]).unwrap();
    let value = g.value(sums).iter().zip(&w).map(|(a, b)| a * b).sum();
    let grads = g.grad(sums, Some(w), &[pos, strain]).unwrap();
    (value, grads)
}

/// A pair sum on the device (the expression step by step over the edges,
/// its reverse sweep, the per-centre sums and the geometry's gradients)
/// gives the host's fused pair sum: value and the gradients of positions
/// and strain, periodic images and a strained triclinic cell included.
#[test]
fn a_pair_sum_on_the_device_gives_the_host_pair_sum() {
    let (host, host_grads) = pair_sum_run(false);
    let (dev, dev_grads) = pair_sum_run(true);
    assert!(host.abs() > 1e-3);
    assert!((dev - host).abs() <= 1e-12 * host.abs(), "{dev} vs {host}");
    close(&dev_grads[0], &host_grads[0], "∂/∂positions");
    close(&dev_grads[1], &host_grads[1], "∂/∂strain");
}
