//! The op engine's generic ops on the GPU ([`CudaEngineDevice`],
//! [`CudaEngineSource`]): every kernel against the reference device (the
//! contract), and every demo model evaluated through the engine with its
//! ops on the GPU against the CPU — f64 to 1e-10 relative, in one process
//! and split over ranks, the same trace, the same bits twice.
//!
//! These need an NVIDIA GPU and run only with `DDMLIP_GPU_TESTS=1`
//! (`scripts/gpu-check.sh`); otherwise each test prints `SKIPPED`.

use ddmlip::EngineDevice;
use ddmlip::{evaluate, DType, EvalOptions, EvalResult};
use ddmlip_atoms::System;
use ddmlip_cuda::{CudaEngineDevice, CudaEngineSource};
use ddmlip_engine::device::{
    DeviceBackend, DeviceBinary, DeviceBroadcast, DeviceCsr, DeviceEdges, DeviceMem, GemmShape,
    GeometrySource, ReferenceDevice,
};
use ddmlip_engine::ops::{Radial, Unary};
use ddmlip_engine::Scalar;
use ddmlip_models::load_model;
use ddmlip_testkit::build::{self, SplitMix64};
use std::sync::Arc;

mod common;
use common::gpu;

const MODELS: [&str; 6] = [
    "lj",
    "eam-demo",
    "bp-demo",
    "schnet-demo",
    "qeq-demo",
    "rebuild-demo",
];

fn random(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| lo + (hi - lo) * 0.5 * (rng.uniform() + 1.0))
        .collect()
}

/// A kernel call under test: backend, inputs, index arrays, output.
type Kernel<'k, T> = dyn Fn(&dyn DeviceBackend<T>, &[DeviceMem], &[DeviceMem], &mut DeviceMem) + 'k;

/// Runs `f` on the GPU and on the reference device with the same inputs
/// (uploaded to each) and returns both outputs, downloaded.
struct Pair<'a, T: Scalar> {
    gpu: &'a dyn DeviceBackend<T>,
    reference: &'a dyn DeviceBackend<T>,
}

impl<T: Scalar> Pair<'_, T> {
    fn run(
        &self,
        inputs: &[&[f64]],
        indices: &[&[u32]],
        out_len: usize,
        out_init: &[f64],
        f: &Kernel<'_, T>,
    ) -> (Vec<f64>, Vec<f64>) {
        let one = |d: &dyn DeviceBackend<T>| {
            let ins: Vec<DeviceMem> = inputs
                .iter()
                .map(|v| {
                    let t: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
                    d.upload(&t).unwrap()
                })
                .collect();
            let idx: Vec<DeviceMem> = indices
                .iter()
                .map(|v| d.upload_indices(v).unwrap())
                .collect();
            let init: Vec<T> = out_init.iter().map(|&x| T::from_f64(x)).collect();
            let mut out = if init.is_empty() {
                d.alloc(out_len).unwrap()
            } else {
                d.upload(&init).unwrap()
            };
            f(d, &ins, &idx, &mut out);
            let mut host = vec![T::zero(); out_len];
            d.download(&out, &mut host).unwrap();
            host.iter()
                .map(|x| x.to_f64_lossless())
                .collect::<Vec<f64>>()
        };
        (one(self.gpu), one(self.reference))
    }
}

/// Asserts `gpu` within `tol` of `reference` (relative to its largest
/// value) and returns the deviation.
fn assert_close(what: &str, gpu: &[f64], reference: &[f64], tol: f64) -> f64 {
    let scale = reference
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(1e-30);
    let worst = gpu
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b).abs() / scale)
        .fold(0.0f64, f64::max);
    assert!(
        worst <= tol,
        "{what}: GPU differs from the reference by {worst:e}"
    );
    worst
}

/// The geometry and strain kernels against the reference device: edge
/// vectors and lengths from positions of the graph's type and from exact
/// f64 ones, periodic or not, their gradients, shifted outer products and
/// strained rows. Returns the largest deviation (these kernels do the
/// host's operations in its order: 0 is expected).
fn geometry_kernels_match<T: Scalar>(p: &Pair<'_, T>, tol: f64) -> f64 {
    let (atoms, n_edges, systems) = (200, 3000, 2);
    let positions = random(3 * atoms, 11, -40.0, 40.0);
    let cells: Vec<f64> = random(9 * systems, 12, -1.0, 1.0)
        .iter()
        .enumerate()
        .map(|(i, x)| if i % 4 == 0 { 9.0 + x } else { 2.0 * x })
        .collect();
    let ends = |seed| -> Vec<u32> {
        random(n_edges, seed, 0.0, atoms as f64)
            .iter()
            .map(|&x| (x as u32).min(atoms as u32 - 1))
            .collect()
    };
    let (center, neighbor) = (ends(13), ends(14));
    let shifts: Vec<u32> = random(3 * n_edges, 15, -2.5, 2.5)
        .iter()
        .map(|&x| (x.round() as i32) as u32)
        .collect();
    let system: Vec<u32> = (0..n_edges as u32).map(|e| e % 2).collect();
    let g = random(n_edges, 16, -1.0, 1.0);
    let mut worst = 0.0f64;
    for exact in [false, true] {
        for periodic in [false, true] {
            for what in ["vectors", "lengths", "length gradient", "shift outer"] {
                let out_len = match what {
                    "vectors" | "length gradient" => 3 * n_edges,
                    "lengths" => n_edges,
                    _ => 9 * n_edges,
                };
                let (gpu, reference) = p.run(
                    &[&positions, &cells, &g],
                    &[&center, &neighbor, &shifts, &system],
                    out_len,
                    &[],
                    &|d, i, x, o| {
                        let (pos64, cell64);
                        let source = if exact {
                            pos64 = d.upload_f64(&positions).unwrap();
                            cell64 = d.upload_f64(&cells).unwrap();
                            GeometrySource {
                                positions: &pos64,
                                cell: periodic.then_some(&cell64),
                                exact: true,
                            }
                        } else {
                            GeometrySource {
                                positions: &i[0],
                                cell: periodic.then_some(&i[1]),
                                exact: false,
                            }
                        };
                        let edges = DeviceEdges {
                            center: &x[0],
                            neighbor: &x[1],
                            periodic: periodic.then_some((&x[2], &x[3])),
                            count: n_edges,
                        };
                        match what {
                            "vectors" => d.edge_geometry(&edges, source, Some(o), None).unwrap(),
                            "lengths" => d.edge_geometry(&edges, source, None, Some(o)).unwrap(),
                            "length gradient" => {
                                let mut l = d.alloc(n_edges).unwrap();
                                d.edge_geometry(&edges, source, None, Some(&mut l)).unwrap();
                                d.length_gradient_rows(&edges, source, &i[2], &l, o)
                                    .unwrap()
                            }
                            _ => {
                                let mut v = d.alloc(3 * n_edges).unwrap();
                                d.edge_geometry(&edges, source, Some(&mut v), None).unwrap();
                                let all = DeviceEdges {
                                    center: &x[0],
                                    neighbor: &x[1],
                                    periodic: Some((&x[2], &x[3])),
                                    count: n_edges,
                                };
                                d.shift_outer(&all, &v, o).unwrap()
                            }
                        }
                    },
                );
                let label = format!("{what} (exact {exact}, periodic {periodic})");
                worst = worst.max(assert_close(&label, &gpu, &reference, tol));
            }
        }
    }
    // Strain: positions of 200 atoms over two systems.
    let atom_system: Vec<u32> = (0..atoms as u32).map(|a| a % 2).collect();
    let eps = random(9 * systems, 17, -0.05, 0.05);
    let grad = random(3 * atoms, 18, -1.0, 1.0);
    let init = random(9 * atoms, 19, -1.0, 1.0);
    for (what, len) in [
        ("strain", 3 * atoms),
        ("strain gradient", 3 * atoms),
        ("outer", 9 * atoms),
    ] {
        for acc in [false, true] {
            if acc && what != "strain gradient" {
                continue;
            }
            let start = &init[..if acc { len } else { 0 }];
            let (gpu, reference) = p.run(
                &[&positions, &eps, &grad],
                &[&atom_system],
                len,
                start,
                &|d, i, x, o| match what {
                    "strain" => d.strain_rows(&i[0], &i[1], &x[0], o).unwrap(),
                    "strain gradient" => d.strain_rows_grad(&i[1], &x[0], &i[2], o, acc).unwrap(),
                    _ => d.row_outer(&i[0], &i[2], o).unwrap(),
                },
            );
            let label = format!("{what} acc={acc}");
            worst = worst.max(assert_close(&label, &gpu, &reference, tol));
        }
    }
    worst
}

/// Every kernel of the backend against the reference device.
fn kernels_match<T: Scalar>(gpu: &dyn DeviceBackend<T>, tol: f64) {
    let reference = ReferenceDevice::new();
    let p = Pair {
        gpu,
        reference: &reference,
    };
    let geometry = geometry_kernels_match(&p, tol);
    println!("engine geometry kernels: {geometry:.1e} from the reference device");
    let (rows, cols) = (1000, 7);
    let n = rows * cols;
    let a = random(n, 1, -2.0, 2.0);
    let b = random(n, 2, -2.0, 2.0);
    let pos = random(n, 3, 0.1, 3.0);
    let init = random(n, 4, -1.0, 1.0);
    for acc in [false, true] {
        let start: &[f64] = if acc { &init } else { &[] };
        let (g, r) = p.run(&[&a], &[], n, start, &|d, i, _, o| {
            d.axpy(-1.5, &i[0], o, acc).unwrap()
        });
        assert_close(&format!("axpy acc={acc}"), &g, &r, tol);
        for f in [
            Unary::Silu,
            Unary::Tanh,
            Unary::Sigmoid,
            Unary::ShiftedSoftplus,
            Unary::Exp,
            Unary::Ln,
            Unary::Sqrt,
            Unary::Square,
            Unary::Recip,
            Unary::Neg,
            Unary::Scale(0.7),
            Unary::AddScalar(-0.3),
            Unary::Powf(-6.0),
            Unary::Powf(1.5),
            Unary::ScaledSilu(1.68),
            Unary::Cos,
            Unary::Sin,
        ] {
            if !acc {
                let (g, r) = p.run(&[&pos], &[], n, &[], &|d, i, _, o| {
                    d.unary(f, &i[0], o).unwrap()
                });
                assert_close(&format!("{f:?}"), &g, &r, tol);
            }
            let (g, r) = p.run(&[&pos, &b, &a], &[], n, start, &|d, i, _, o| {
                // y = f(x) on the device first, as the engine keeps it.
                let mut y = d.alloc(n).unwrap();
                d.unary(f, &i[0], &mut y).unwrap();
                d.unary_grad(f, &i[0], &y, &i[2], o, acc).unwrap()
            });
            assert_close(&format!("{f:?} gradient acc={acc}"), &g, &r, tol);
        }
        for op in [DeviceBinary::Add, DeviceBinary::Sub, DeviceBinary::Mul] {
            for (bc, blen) in [
                (DeviceBroadcast::Full, n),
                (DeviceBroadcast::PerRow, rows),
                (DeviceBroadcast::PerCol, cols),
                (DeviceBroadcast::Scalar, 1),
            ] {
                let (g, r) = p.run(&[&a, &b[..blen]], &[], n, start, &|d, i, _, o| {
                    d.binary(op, &i[0], &i[1], bc, rows, cols, o, acc).unwrap()
                });
                assert_close(&format!("{op:?} {bc:?} acc={acc}"), &g, &r, tol);
            }
        }
        let (g, r) = p.run(
            &[&a],
            &[],
            rows,
            &init[..if acc { rows } else { 0 }],
            &|d, i, _, o| d.row_sums(&i[0], rows, cols, o, acc).unwrap(),
        );
        assert_close(&format!("row sums acc={acc}"), &g, &r, tol);
        let (g, r) = p.run(
            &[&a],
            &[],
            cols,
            &init[..if acc { cols } else { 0 }],
            &|d, i, _, o| d.col_sums(&i[0], rows, cols, o, acc).unwrap(),
        );
        assert_close(&format!("column sums acc={acc}"), &g, &r, tol);
        // GEMMs in every transposition: (m, k, n) = (37, 19, 23).
        let (m, k, nn) = (37, 19, 23);
        for (at, bt) in [(false, false), (true, false), (false, true), (true, true)] {
            let shape = GemmShape {
                m,
                k,
                n: nn,
                a_transposed: at,
                b_transposed: bt,
            };
            let (g, r) = p.run(
                &[&a[..m * k], &b[..k * nn]],
                &[],
                m * nn,
                &init[..if acc { m * nn } else { 0 }],
                &|d, i, _, o| d.gemm(shape, &i[0], &i[1], o, acc).unwrap(),
            );
            assert_close(&format!("GEMM {shape:?} acc={acc}"), &g, &r, tol);
        }
    }
    // Gathers and inverse-map sums: a random index, its inverse map by
    // sources (a permutation), a sorted one without, and a few wide targets.
    let targets = 300;
    let index: Vec<u32> = random(rows, 5, 0.0, targets as f64)
        .iter()
        .map(|&x| (x as u32).min(targets as u32 - 1))
        .collect();
    let (g, r) = p.run(&[&a[..targets * cols]], &[&index], n, &[], &|d, i, x, o| {
        d.gather_rows(&i[0], cols, &x[0], o).unwrap()
    });
    assert_close("gather", &g, &r, 0.0);
    let mut order: Vec<u32> = (0..rows as u32).collect();
    order.sort_by_key(|&s| (index[s as usize], s));
    let mut offsets = vec![0u32; targets + 1];
    for &t in &index {
        offsets[t as usize + 1] += 1;
    }
    for t in 0..targets {
        offsets[t + 1] += offsets[t];
    }
    let wide_offsets = vec![0u32, 1, 600, rows as u32];
    for (name, offs, sources, t) in [
        ("permuted", &offsets, Some(&order), targets),
        ("sorted", &offsets, None, targets),
        ("wide", &wide_offsets, None, 3),
    ] {
        for acc in [false, true] {
            let start = &init[..if acc { t * cols } else { 0 }];
            let (g, r) = p.run(&[&a], &[], t * cols, start, &|d, i, _, o| {
                let csr = DeviceCsr {
                    offsets: d.upload_indices(offs).unwrap(),
                    sources: sources.map(|s| d.upload_indices(s).unwrap()),
                    targets: t,
                };
                d.sum_rows_csr(&i[0], cols, &csr, o, acc).unwrap()
            });
            assert_close(&format!("inverse-map sums ({name}) acc={acc}"), &g, &r, tol);
        }
    }
    let d = random(rows, 6, 0.2, 5.5);
    for f in [
        Radial::Gaussian {
            centers: random(8, 7, 0.0, 5.0),
            gamma: 1.3,
        },
        Radial::Bessel { n: 6, cutoff: 5.0 },
        Radial::CosineCutoff { cutoff: 5.0 },
        Radial::PolynomialCutoff { cutoff: 5.0, p: 6 },
    ] {
        let k = f.width();
        for which in [0, 1] {
            let (g, r) = p.run(&[&d], &[], rows * k, &[], &|dev, i, _, o| {
                let mut other = dev.alloc(rows * k).unwrap();
                if which == 0 {
                    dev.radial(&f, &i[0], o, &mut other).unwrap()
                } else {
                    dev.radial(&f, &i[0], &mut other, o).unwrap()
                }
            });
            let what = if which == 0 { "values" } else { "derivatives" };
            assert_close(&format!("{f:?} {what}"), &g, &r, tol);
        }
    }
}

#[test]
fn every_kernel_equals_the_reference_device() {
    let Some(dev) = gpu() else { return };
    let index = dev.index();
    let f64_gpu = CudaEngineDevice::<f64>::open(index).unwrap();
    kernels_match::<f64>(&f64_gpu, 1e-13);
    let f32_gpu = CudaEngineDevice::<f32>::open(index).unwrap();
    kernels_match::<f32>(&f32_gpu, 2e-6);
    println!("engine kernels: f64 within 1e-13, f32 within 2e-6 of the reference device");
}

fn systems() -> Vec<System> {
    let mut fcc = build::fcc(29, 3.615, 4);
    build::rattle_uniform(&mut fcc, 0.05, 7);
    let mut slab = build::fcc(29, 3.615, 3);
    build::rattle_uniform(&mut slab, 0.1, 3);
    slab.pbc = [true, true, false];
    let mut cluster = build::fcc(29, 3.615, 2);
    build::rattle_uniform(&mut cluster, 0.1, 5);
    cluster.cell = None;
    cluster.pbc = [false; 3];
    vec![fcc, slab, cluster]
}

fn difference(a: &EvalResult, b: &EvalResult) -> f64 {
    let mut worst = 0.0f64;
    for name in ["energy", "forces", "stress", "atomic_energies"] {
        let (Some(x), Some(y)) = (a.outputs.get(name), b.outputs.get(name)) else {
            continue;
        };
        let scale = y
            .values
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()))
            .max(1e-300);
        for (p, q) in x.values.iter().zip(&y.values) {
            if !(p.is_nan() && q.is_nan()) {
                worst = worst.max((p - q).abs() / scale);
            }
        }
    }
    worst
}

#[test]
fn demo_models_through_the_engine_on_the_gpu_equal_the_cpu() {
    let Some(dev) = gpu() else { return };
    let source = EngineDevice(Arc::new(CudaEngineSource::open(dev.index()).unwrap()));
    let batch = systems();
    for name in MODELS {
        let model = load_model(name).unwrap();
        let host = evaluate(model.as_ref(), &batch, &EvalOptions::default()).unwrap();
        for ranks in [1, 3] {
            let opts = EvalOptions {
                ranks,
                trace: true,
                device: Some(source.clone()),
                ..Default::default()
            };
            let on_gpu = evaluate(model.as_ref(), &batch, &opts).unwrap();
            let again = evaluate(model.as_ref(), &batch, &opts).unwrap();
            let d = difference(&on_gpu, &host);
            println!("engine on GPU {name} f64 {ranks} rank(s): {d:.2e} from the CPU");
            assert!(d <= 1e-10, "{name} on {ranks} ranks: {d:e}");
            assert_eq!(
                difference(&on_gpu, &again),
                0.0,
                "{name}: a second run differs"
            );
            let host_traced = evaluate(
                model.as_ref(),
                &batch,
                &EvalOptions {
                    ranks,
                    trace: true,
                    ..Default::default()
                },
            )
            .unwrap();
            let mut on_device = 0;
            for (h, g) in host_traced
                .diagnostics
                .traces
                .iter()
                .zip(&on_gpu.diagnostics.traces)
            {
                assert_eq!(h.events.len(), g.events.len());
                for (a, b) in h.events.iter().zip(&g.events) {
                    assert_eq!(
                        (&a.op, &a.output, &a.handler),
                        (&b.op, &b.output, &b.handler)
                    );
                    on_device +=
                        usize::from(b.device.as_deref().is_some_and(|d| d.starts_with("cuda:")));
                }
            }
            assert!(on_device > 0, "{name}: no op ran on the GPU");
        }
        let f32_gpu = evaluate(
            model.as_ref(),
            &batch,
            &EvalOptions {
                dtype: DType::F32,
                device: Some(source.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        let d = difference(&f32_gpu, &host);
        println!("engine on GPU {name} f32: {d:.2e} from the CPU f64");
        assert!(d <= 1e-4, "{name} in f32: {d:e}");
    }
}

/// SevenNet-0 through the engine on the GPU: the edge features, gates and
/// convolutions run as SevenNet's CUDA kernels on the engine's arrays, the
/// irreps linears as cuBLAS GEMMs, the rest as the engine's generic
/// kernels; f64 equals the CPU path to 1e-10 on the fixture frames, in one
/// process and over 3 ranks, the same bits twice and the same trace.
#[test]
fn sevennet0_through_the_engine_on_the_gpu_equals_the_cpu() {
    let Some(dev) = gpu() else { return };
    let source = EngineDevice(Arc::new(CudaEngineSource::open(dev.index()).unwrap()));
    let model = load_model("sevennet-0").expect("the SevenNet-0 checkpoint");
    let frames = common::fixture_frames();
    let host = evaluate(model.as_ref(), &frames, &EvalOptions::default()).unwrap();
    for ranks in [1, 3] {
        let opts = EvalOptions {
            ranks,
            trace: true,
            device: Some(source.clone()),
            ..Default::default()
        };
        let on_gpu = evaluate(model.as_ref(), &frames, &opts).unwrap();
        let again = evaluate(model.as_ref(), &frames, &opts).unwrap();
        let d = difference(&on_gpu, &host);
        println!("engine on GPU sevennet-0 f64 {ranks} rank(s): {d:.2e} from the CPU");
        assert!(d <= 1e-10, "SevenNet-0 on {ranks} ranks: {d:e}");
        assert_eq!(difference(&on_gpu, &again), 0.0, "a second run differs");
        let (mut on_device, mut on_host) = (Vec::new(), Vec::new());
        for t in &on_gpu.diagnostics.traces {
            for e in &t.events {
                if e.device.as_deref().is_some_and(|d| d.starts_with("cuda:")) {
                    on_device.push(e.op.clone());
                } else {
                    on_host.push(e.op.clone());
                }
            }
        }
        on_host.sort();
        on_host.dedup();
        println!("engine on GPU sevennet-0 {ranks} rank(s): ops on the host: {on_host:?}");
        for op in [
            "rowwise:sevennet_edge_features",
            "slice_cols",
            "rowwise:0_self_connection",
            "rowwise:0_self_interaction_1",
            "message:0_convolution",
            "rowwise:0_self_interaction_2",
            "rowwise:0_equivariant_gate",
            "message:4_convolution",
            "rowwise:reduce_hidden_to_energy",
        ] {
            assert!(
                on_device.iter().any(|o| o == op),
                "{op} did not run on the GPU"
            );
        }
    }
    let f32_gpu = evaluate(
        model.as_ref(),
        &frames,
        &EvalOptions {
            dtype: DType::F32,
            device: Some(source.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let d = difference(&f32_gpu, &host);
    println!("engine on GPU sevennet-0 f32: {d:.2e} from the CPU f64");
    assert!(d <= 1e-4, "SevenNet-0 in f32: {d:e}");
}
