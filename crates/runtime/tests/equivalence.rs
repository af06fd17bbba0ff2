//! Decomposed runs equal the single-process run (f64, 1e-10 relative) for
//! every demo model, rank counts 1–8 and every kind of cell.

use ddmlip_atoms::build::{self, SplitMix64};
use ddmlip_atoms::{Cell, System};
use ddmlip_engine::Model;
use ddmlip_models::load_model;
use ddmlip_runtime::{evaluate, BalancePolicy, EvalOptions, EvalResult};

/// Uniform in [0, 1) from the shared seeded generator.
fn lcg(seed: u64) -> impl FnMut() -> f64 {
    let mut rng = SplitMix64::new(seed);
    move || 0.5 * (rng.uniform() + 1.0)
}

/// Random atoms at liquid-like density with a minimum separation.
fn random_system(cell: Cell, pbc: [bool; 3], n: usize, seed: u64) -> System {
    let mut rng = lcg(seed);
    let mut positions: Vec<[f64; 3]> = Vec::new();
    let mut tries = 0;
    while positions.len() < n && tries < 100_000 {
        tries += 1;
        let f = [rng(), rng(), rng()];
        let p = cell.to_cartesian(f);
        // Brute-force minimum image distance check (small n).
        let ok = positions.iter().all(|q| {
            let mut best = f64::MAX;
            for a in -1..=1 {
                for b in -1..=1 {
                    for c in -1..=1 {
                        let s = [a, b, c];
                        if (0..3).any(|k| !pbc[k] && s[k] != 0) {
                            continue;
                        }
                        let sv = cell.shift_vector(s);
                        let d: f64 = (0..3)
                            .map(|k| (p[k] - q[k] - sv[k]).powi(2))
                            .sum::<f64>()
                            .sqrt();
                        best = best.min(d);
                    }
                }
            }
            best > 1.9
        });
        if ok {
            positions.push(p);
        }
    }
    let numbers = (0..positions.len())
        .map(|i| [29, 8, 14, 1][i % 4])
        .collect();
    System::new(positions, numbers, Some(cell), pbc)
}

/// Rattled FCC copper (±0.05 Å), `n³` conventional cells.
fn fcc(n: usize) -> System {
    let mut sys = build::fcc(29, 3.615, n);
    build::rattle_uniform(&mut sys, 0.05, 7);
    sys
}

fn rel(a: f64, b: f64, scale: f64) -> f64 {
    (a - b).abs() / scale.max(1e-300)
}

/// Max relative difference over energy, forces (scaled by the largest force), stress.
fn compare(a: &EvalResult, b: &EvalResult) -> f64 {
    let mut worst: f64 = 0.0;
    for (x, y) in a
        .energy()
        .expect("energy")
        .iter()
        .zip(b.energy().expect("energy"))
    {
        worst = worst.max(rel(*x, *y, x.abs()));
    }
    let fa = a.forces().expect("forces");
    let fb = b.forces().expect("forces");
    assert_eq!(fa.len(), fb.len());
    let fscale = fa.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
    for (x, y) in fa.iter().flatten().zip(fb.iter().flatten()) {
        assert!(y.is_finite(), "missing force row in the decomposed run");
        worst = worst.max(rel(*x, *y, fscale));
    }
    for (sa, sb) in a
        .stress()
        .expect("stress")
        .iter()
        .zip(b.stress().expect("stress"))
    {
        if let (Some(sa), Some(sb)) = (sa, sb) {
            let s = sa.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for k in 0..6 {
                worst = worst.max(rel(sa[k], sb[k], s));
            }
        }
    }
    if let (Some(ea), Some(eb)) = (a.atomic_energies(), b.atomic_energies()) {
        for (x, y) in ea.iter().zip(eb) {
            worst = worst.max(rel(*x, *y, x.abs().max(1.0)));
        }
    }
    worst
}

/// The split run equals the single-process run, with the regular grid and
/// with even-count (staggered) cuts.
fn check_model(model: &dyn Model, batch: &[System], ranks: &[usize]) {
    let single = evaluate(model, batch, &EvalOptions::default()).unwrap();
    for &r in ranks {
        for balance in [BalancePolicy::Geometric, BalancePolicy::Atoms] {
            let split = evaluate(
                model,
                batch,
                &EvalOptions {
                    ranks: r,
                    balance,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{} on {r} ranks ({balance:?}): {e}", model.name()));
            let d = compare(&single, &split);
            assert!(
                d < 1e-10,
                "{} on {r} ranks ({balance:?}) differs by {d:e}",
                model.name()
            );
        }
    }
}

const MODELS: [&str; 6] = [
    "lj",
    "eam-demo",
    "bp-demo",
    "schnet-demo",
    "qeq-demo",
    "rebuild-demo",
];

#[test]
fn orthorhombic_crystal_all_models_all_ranks() {
    let batch = vec![fcc(4)];
    for name in MODELS {
        let m = load_model(name).unwrap();
        check_model(m.as_ref(), &batch, &[1, 2, 3, 4, 8]);
    }
}

#[test]
fn triclinic_slab_cluster_tiny_and_batch() {
    let tric = random_system(
        Cell::new([[12.0, 0.0, 0.0], [3.1, 11.0, 0.0], [-2.2, 1.7, 10.5]]),
        [true; 3],
        60,
        1,
    );
    let slab = random_system(
        Cell::new([[11.0, 0.0, 0.0], [4.0, 10.0, 0.0], [0.0, 0.0, 20.0]]),
        [true, true, false],
        50,
        2,
    );
    let mut cluster = random_system(Cell::orthorhombic(12.0, 12.0, 12.0), [false; 3], 40, 3);
    cluster.cell = None;
    // A cell smaller than the cutoff: every atom sees several of its own images.
    let tiny = System::new(
        vec![[0.0, 0.0, 0.0], [1.40, 1.33, 1.37]],
        vec![14, 14],
        Some(Cell::new([
            [0.0, 2.715, 2.715],
            [2.715, 0.0, 2.715],
            [2.715, 2.715, 0.0],
        ])),
        [true; 3],
    );
    for name in MODELS {
        let m = load_model(name).unwrap();
        for sys in [&tric, &slab, &cluster, &tiny] {
            check_model(m.as_ref(), std::slice::from_ref(sys), &[2, 3, 5]);
        }
        check_model(
            m.as_ref(),
            &[tric.clone(), cluster.clone(), tiny.clone()],
            &[2, 4],
        );
    }
}

mod random_systems {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Random triclinic cells, periodicity, atom counts and rank counts:
        /// the decomposed run equals the single-process run.
        #[test]
        fn decomposed_equals_single_process(
            seed in 0u64..1_000_000,
            skew in proptest::array::uniform3(-0.3f64..0.3),
            lengths in proptest::array::uniform3(6.0f64..16.0),
            pbc in proptest::array::uniform3(any::<bool>()),
            n in 8usize..48,
            ranks in 1usize..=8,
            model_pick in 0usize..6,
            even_counts in any::<bool>(),
        ) {
            let cell = Cell::new([
                [lengths[0], 0.0, 0.0],
                [skew[0] * lengths[1], lengths[1], 0.0],
                [skew[1] * lengths[2], skew[2] * lengths[2], lengths[2]],
            ]);
            let sys = random_system(cell, pbc, n, seed);
            let m = load_model(MODELS[model_pick]).unwrap();
            let single = evaluate(m.as_ref(), std::slice::from_ref(&sys), &EvalOptions::default()).unwrap();
            let balance = if even_counts { BalancePolicy::Atoms } else { BalancePolicy::Geometric };
            let split = evaluate(m.as_ref(), std::slice::from_ref(&sys), &EvalOptions { ranks, balance, ..Default::default() }).unwrap();
            let d = compare(&single, &split);
            prop_assert!(d < 1e-10, "{} on {ranks} ranks ({balance:?}): {d:e}", MODELS[model_pick]);
        }
    }
}

/// Every output of a run, bit for bit (NaN rows compare equal).
fn bits(r: &EvalResult) -> Vec<(String, Vec<u64>)> {
    r.outputs
        .iter()
        .map(|(k, o)| (k.clone(), o.values.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

/// An evaluator reuses each rank's tensor memory between calls: results
/// must not depend on what the buffers held before, so a reused evaluator
/// gives bit for bit what a fresh one gives, also after a different (larger
/// then smaller) system, in f64 and f32, single-process and split, with
/// private rank pools of 1 and 2 threads.
#[test]
fn evaluator_reuse_gives_fresh_results() {
    use ddmlip_engine::DType;
    use ddmlip_runtime::Evaluator;
    let small = vec![fcc(3)];
    let large = vec![random_system(
        Cell::new([[12.0, 0.0, 0.0], [3.1, 11.0, 0.0], [-2.2, 1.7, 10.5]]),
        [true; 3],
        70,
        11,
    )];
    for name in MODELS {
        let m = load_model(name).unwrap();
        for (ranks, threads) in [(1, 0), (3, 1), (4, 2)] {
            for dtype in [DType::F64, DType::F32] {
                let opts = EvalOptions {
                    ranks,
                    dtype,
                    threads_per_rank: threads,
                    ..Default::default()
                };
                let mut reused = Evaluator::new(m.as_ref(), opts.clone());
                for batch in [&small, &large, &small, &large] {
                    let got = reused.evaluate(batch).unwrap();
                    let fresh = evaluate(m.as_ref(), batch, &opts).unwrap();
                    assert_eq!(
                        bits(&got),
                        bits(&fresh),
                        "{name}, {ranks} ranks, {dtype}: reused buffers changed the result"
                    );
                }
            }
        }
    }
    // Per-edge tensors of a larger system are kept for the next call.
    let lj = load_model("lj").unwrap();
    let mut kept = Evaluator::new(lj.as_ref(), EvalOptions::default());
    kept.evaluate(&[fcc(5)]).unwrap();
    assert!(kept.held_bytes() > 0, "no memory kept between calls");
}

/// Like an MD run: once an evaluator has seen a system, evaluating the same
/// system again allocates no large tensor afresh, single-process or split.
#[test]
fn repeated_evaluations_reuse_all_tensor_memory() {
    use ddmlip_engine::DType;
    use ddmlip_runtime::Evaluator;
    // Crystals large enough that every rank holds buffers the pool keeps
    // (2^14 elements and more): lj keeps nothing per edge, so its per-atom
    // rows must reach that; eam-demo's short cutoff needs more atoms.
    for (name, cells) in [("lj", 12), ("schnet-demo", 6), ("eam-demo", 8)] {
        let batch = vec![fcc(cells)];
        let m = load_model(name).unwrap();
        for ranks in [1, 2, 4] {
            for dtype in [DType::F64, DType::F32] {
                let opts = EvalOptions {
                    ranks,
                    dtype,
                    threads_per_rank: 1,
                    ..Default::default()
                };
                let mut ev = Evaluator::new(m.as_ref(), opts);
                ev.evaluate(&batch).unwrap();
                let after_first = ev.fresh_allocations();
                // Without a single pooled (large) buffer the check below
                // would pass vacuously.
                assert!(
                    after_first > 0,
                    "{name}, {ranks} ranks, {dtype}: the first call allocates"
                );
                ev.evaluate(&batch).unwrap();
                let after_second = ev.fresh_allocations();
                ev.evaluate(&batch).unwrap();
                assert_eq!(
                    ev.fresh_allocations(),
                    after_second,
                    "{name}, {ranks} ranks, {dtype}: a repeated call allocated afresh"
                );
            }
        }
    }
}

/// Every rank reports its time line: phases are non-negative and every rank
/// starts after the partition.
#[test]
fn rank_timings_are_consistent() {
    let m = load_model("lj").unwrap();
    let r = evaluate(
        m.as_ref(),
        &[fcc(3)],
        &EvalOptions {
            ranks: 3,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.diagnostics.rank_timings.len(), 3);
    for t in &r.diagnostics.rank_timings {
        for v in [t.setup, t.forward, t.backward, t.reduce, t.gather, t.comm] {
            assert!(v >= 0.0 && v.is_finite());
        }
        assert!(t.start >= r.diagnostics.partition_s);
        assert!(t.comm <= t.forward + t.backward + t.reduce + 1e-9);
    }
}

/// The energy's all-reduce completes after the backward pass (one meeting
/// of the ranks per step instead of two), with the same result as the eager
/// run that tracing forces; a model that reads a per-system sum during its
/// forward pass (qeq-demo) falls back to eager sums and stays exact.
#[test]
fn deferred_energy_sum_matches_eager_and_skips_the_adjoint_exchange() {
    let batch = vec![fcc(3)];
    for name in ["lj", "schnet-demo", "qeq-demo"] {
        let m = load_model(name).unwrap();
        let run = |trace: bool| {
            evaluate(
                m.as_ref(),
                &batch,
                &EvalOptions {
                    ranks: 3,
                    trace,
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let (deferred, eager) = (run(false), run(true));
        let single = evaluate(m.as_ref(), &batch, &EvalOptions::default()).unwrap();
        for r in [&deferred, &eager] {
            let d = compare(r, &single);
            assert!(d < 1e-10, "{name}: decomposed differs by {d:e}");
        }
        let adjoints = |r: &EvalResult| {
            r.diagnostics
                .handler_counts
                .get("reduce:all_reduce(adjoint)")
                .copied()
                .unwrap_or(0)
        };
        assert!(
            adjoints(&eager) > 0,
            "{name}: eager run exchanges in backward"
        );
        if name == "qeq-demo" {
            assert_eq!(
                adjoints(&deferred),
                adjoints(&eager),
                "{name}: eager fallback"
            );
        } else {
            assert_eq!(adjoints(&deferred), 0, "{name}: deferred energy sum");
        }
    }
}

/// Scatters sum in source order on one thread and through the inverse map
/// on several (ARCHITECTURE.md, "Determinism"): the same sums in the same
/// order, so a run gives the same bits on any number of threads, split or
/// not. The crystal is large enough for the parallel paths to engage.
#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Diamond Si, 2×2×1 conventional cells: 32 atoms, c = 5.43 Å below the
    // lj cutoff, so atoms meet their own images (edges whose centre and
    // neighbour are the same atom) among some 7,000 edges.
    let a = 5.43;
    let basis = [
        [0.0, 0.0, 0.0],
        [0.0, 0.5, 0.5],
        [0.5, 0.0, 0.5],
        [0.5, 0.5, 0.0],
        [0.25, 0.25, 0.25],
        [0.25, 0.75, 0.75],
        [0.75, 0.25, 0.75],
        [0.75, 0.75, 0.25],
    ];
    let mut positions = Vec::new();
    for (i, j) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        for b in basis {
            positions.push([
                (b[0] + i as f64) * a,
                (b[1] + j as f64) * a,
                b[2] * a + 0.01 * i as f64,
            ]);
        }
    }
    let n = positions.len();
    let small_cell = System::new(
        positions,
        vec![14; n],
        Some(Cell::orthorhombic(2.0 * a, 2.0 * a, a)),
        [true; 3],
    );
    for (name, batch) in [
        ("lj", vec![fcc(6)]),
        ("schnet-demo", vec![fcc(6)]),
        ("eam-demo", vec![fcc(6)]),
        ("lj", vec![small_cell]),
    ] {
        let m = load_model(name).unwrap();
        for ranks in [1usize, 2] {
            let run = |threads: usize| {
                let opts = EvalOptions {
                    ranks,
                    threads_per_rank: threads,
                    ..Default::default()
                };
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
                    .install(|| evaluate(m.as_ref(), &batch, &opts).unwrap())
            };
            let one = run(1);
            for threads in [2, 3] {
                assert_eq!(
                    bits(&run(threads)),
                    bits(&one),
                    "{name}, {ranks} rank(s): {threads} threads differ from one"
                );
            }
        }
    }
}

/// Ranks that wait run pieces of the pair sums of ranks still working: on a
/// crystal large enough for several pieces per rank, the split run with and
/// without that help equals the single-process run.
#[test]
fn work_sharing_keeps_the_single_process_answer() {
    let lj = load_model("lj").unwrap();
    // 6,912 atoms × 371 pairs: past 2^18 pairs per piece on 2 and 3 ranks.
    let batch = vec![fcc(12)];
    let single = evaluate(lj.as_ref(), &batch, &EvalOptions::default()).unwrap();
    for ranks in [2, 3] {
        for work_sharing in [true, false] {
            let opts = EvalOptions {
                ranks,
                threads_per_rank: 1,
                work_sharing,
                ..Default::default()
            };
            let split = evaluate(lj.as_ref(), &batch, &opts).unwrap();
            let d = compare(&single, &split);
            assert!(d < 1e-10, "{ranks} ranks, sharing {work_sharing}: {d:e}");
        }
    }
}

/// schnet-demo's ops (matmul, gather, scatter, element-wise) split into
/// pieces that compute every row as one pass does: sharing work changes no
/// bit of the split run, which equals the single-process one.
#[test]
fn work_sharing_in_row_ops_changes_no_bit() {
    let schnet = load_model("schnet-demo").unwrap();
    // 1,372 atoms × ~42 edges × 32 features: many pieces of 2^17 per op.
    let batch = vec![fcc(7)];
    let single = evaluate(schnet.as_ref(), &batch, &EvalOptions::default()).unwrap();
    for ranks in [2, 3] {
        let run = |work_sharing| {
            let opts = EvalOptions {
                ranks,
                threads_per_rank: 1,
                work_sharing,
                ..Default::default()
            };
            evaluate(schnet.as_ref(), &batch, &opts).unwrap()
        };
        let (shared, alone) = (run(true), run(false));
        let d = compare(&single, &shared);
        assert!(d < 1e-10, "{ranks} ranks: {d:e} from the single process");
        let bits = |r: &EvalResult| -> Vec<u64> {
            let forces = r.forces().expect("forces");
            let forces = forces.iter().flatten().copied();
            r.energy()
                .expect("energy")
                .iter()
                .copied()
                .chain(forces)
                .map(f64::to_bits)
                .collect()
        };
        assert_eq!(
            bits(&shared),
            bits(&alone),
            "{ranks} ranks: sharing changed bits"
        );
    }
}
