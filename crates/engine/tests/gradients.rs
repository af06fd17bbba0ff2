//! Every op's backward against central finite differences of its forward, in f64.

use ddmlip_engine::ops::{PeriodicShifts, Pointwise, Unary};
use ddmlip_engine::{Buffers, Edges, EngineError, Graph, OpaqueKernel, RowDomain, Tensor};
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

/// An op chain under test: builds an output from the leaves.
type Build = dyn Fn(&mut Graph<f64>, &[Tensor]) -> Result<Tensor, EngineError>;

/// Builds `L = Σ w ⊙ f(inputs)` and returns (L, ∂L/∂inputs).
fn eval(
    inputs: &[(Vec<f64>, usize, usize, RowDomain)],
    f: &Build,
    with_grad: bool,
) -> (f64, Vec<Vec<f64>>) {
    let mut g = Graph::<f64>::new();
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|(v, r, c, d)| g.leaf(v.clone(), *r, *c, *d))
        .collect();
    let y = f(&mut g, &leaves).unwrap();
    let (r, c) = g.shape(y);
    let w = rand_vec(r * c, 99);
    let loss: f64 = g.value(y).iter().zip(&w).map(|(a, b)| a * b).sum();
    if !with_grad {
        return (loss, vec![]);
    }
    let grads = g.grad(y, Some(w), &leaves).unwrap();
    (loss, grads)
}

fn check(inputs: Vec<(Vec<f64>, usize, usize, RowDomain)>, f: &Build) {
    let (_, grads) = eval(&inputs, f, true);
    let h = 1e-6;
    for (k, (v, _, _, _)) in inputs.iter().enumerate() {
        for (i, &an) in grads[k].iter().enumerate().take(v.len()) {
            let mut plus = inputs.clone();
            plus[k].0[i] += h;
            let mut minus = inputs.clone();
            minus[k].0[i] -= h;
            let fd = (eval(&plus, f, false).0 - eval(&minus, f, false).0) / (2.0 * h);
            assert!(
                (fd - an).abs() <= 1e-6 * (1.0 + fd.abs()),
                "input {k} element {i}: analytic {an} vs finite difference {fd}"
            );
        }
    }
}

fn atoms(n: usize, c: usize, seed: u64) -> (Vec<f64>, usize, usize, RowDomain) {
    (rand_vec(n * c, seed), n, c, RowDomain::Atom)
}

#[test]
fn unary_ops_match_finite_differences() {
    for f in [
        Unary::Silu,
        Unary::Tanh,
        Unary::Sigmoid,
        Unary::ShiftedSoftplus,
        Unary::Exp,
        Unary::Square,
        Unary::Neg,
        Unary::Scale(1.7),
        Unary::AddScalar(0.3),
        Unary::ScaledSilu(1.679),
    ] {
        check(vec![atoms(4, 3, 1)], &move |g, t| g.unary(t[0], f));
    }
    // Positive-domain functions.
    let pos = (
        rand_vec(12, 2).iter().map(|x| x + 1.5).collect(),
        4,
        3,
        RowDomain::Atom,
    );
    for f in [Unary::Ln, Unary::Sqrt, Unary::Recip, Unary::Powf(2.5)] {
        check(vec![pos.clone()], &move |g, t| g.unary(t[0], f));
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    let a = atoms(5, 3, 3);
    let full = atoms(5, 3, 4);
    let per_row = atoms(5, 1, 5);
    let per_col = (rand_vec(3, 6), 1, 3, RowDomain::None);
    let scalar = (vec![0.7], 1, 1, RowDomain::None);
    for b in [full, per_row, per_col, scalar] {
        check(vec![a.clone(), b.clone()], &|g, t| g.add(t[0], t[1]));
        check(vec![a.clone(), b.clone()], &|g, t| g.sub(t[0], t[1]));
        check(vec![a.clone(), b.clone()], &|g, t| g.mul(t[0], t[1]));
        let mut bpos = b.clone();
        bpos.0.iter_mut().for_each(|x| *x += 2.0);
        check(vec![a.clone(), bpos], &|g, t| g.div(t[0], t[1]));
    }
}

#[test]
fn matmul_and_linear() {
    check(
        vec![atoms(6, 4, 7), (rand_vec(12, 8), 4, 3, RowDomain::None)],
        &|g, t| g.matmul(t[0], t[1]),
    );
    // Tall enough to take the row-blocked parallel path.
    check(
        vec![atoms(600, 5, 9), (rand_vec(30, 10), 5, 6, RowDomain::None)],
        &|g, t| {
            let y = g.matmul(t[0], t[1])?;
            g.sum_rows(y)
        },
    );
    check(
        vec![
            atoms(3, 4, 11),
            (rand_vec(8, 12), 4, 2, RowDomain::None),
            (rand_vec(2, 13), 1, 2, RowDomain::None),
        ],
        &|g, t| g.linear(t[0], t[1], Some(t[2])),
    );
}

#[test]
fn gather_scatter_segment() {
    let edges_i: Arc<Vec<u32>> = Arc::new(vec![0, 0, 1, 2, 3, 3, 3, 1]);
    let edges_j: Arc<Vec<u32>> = Arc::new(vec![1, 2, 0, 3, 0, 1, 2, 2]);
    let (ei, ej) = (edges_i.clone(), edges_j.clone());
    check(vec![atoms(4, 2, 14)], &move |g, t| {
        let j = g.index(
            ej.clone(),
            RowDomain::Edge,
            RowDomain::Atom,
            4,
            "edge_neighbor",
        )?;
        let i = g.index(
            ei.clone(),
            RowDomain::Edge,
            RowDomain::Atom,
            4,
            "edge_center",
        )?;
        let m = g.gather(t[0], j)?;
        let m = g.silu(m)?;
        g.scatter_add(m, i)
    });
    let sys: Arc<Vec<u32>> = Arc::new(vec![0, 1, 1, 0]);
    check(vec![atoms(4, 3, 15)], &move |g, t| {
        let s = g.index(
            sys.clone(),
            RowDomain::Atom,
            RowDomain::System,
            2,
            "atom_system",
        )?;
        let e = g.segment_sum(t[0], s)?;
        let e2 = g.unary(e, Unary::Square)?;
        let back = g.gather(e2, s)?; // System → Atom broadcast
        g.mul(back, t[0])
    });
}

/// Centre rows, neighbour rows and image shifts of a periodic edge set.
type EdgeArrays = (Arc<Vec<u32>>, Arc<Vec<u32>>, Arc<Vec<[i32; 3]>>);

/// The neighbour graph (lengths; vectors on request) of `arrays` over
/// positions `t[0]` and cell `t[1]`, both strained by `t[2]`.
fn strained_edges(
    g: &mut Graph<f64>,
    t: &[Tensor],
    (ci, ni, shifts): &EdgeArrays,
) -> Result<ddmlip_engine::Edges, EngineError> {
    let n_atoms = g.shape(t[0]).0;
    let n_edges = ci.len();
    let a_sys = g.index(
        Arc::new(vec![0; n_atoms]),
        RowDomain::Atom,
        RowDomain::System,
        1,
        "atom_system",
    )?;
    let c_sys = g.index(
        Arc::new(vec![0; 3]),
        RowDomain::System,
        RowDomain::System,
        1,
        "cell_system",
    )?;
    let e_sys = g.index(
        Arc::new(vec![0; n_edges]),
        RowDomain::Edge,
        RowDomain::System,
        1,
        "edge_system",
    )?;
    let i = g.index(
        ci.clone(),
        RowDomain::Edge,
        RowDomain::Atom,
        n_atoms,
        "edge_center",
    )?;
    let j = g.index(
        ni.clone(),
        RowDomain::Edge,
        RowDomain::Atom,
        n_atoms,
        "edge_neighbor",
    )?;
    let p = g.apply_strain(t[0], t[2], a_sys)?;
    let c = g.apply_strain(t[1], t[2], c_sys)?;
    g.edges(
        p,
        i,
        j,
        e_sys,
        Some(PeriodicShifts {
            cell: c,
            shifts: shifts.clone(),
            edge_system: e_sys,
        }),
    )
}

#[test]
fn geometry_strain_and_edge_vectors() {
    // The last edge joins atom 0 to its own image.
    let ci: Arc<Vec<u32>> = Arc::new(vec![0, 1, 2, 0]);
    let ni: Arc<Vec<u32>> = Arc::new(vec![1, 0, 0, 0]);
    let shifts: Arc<Vec<[i32; 3]>> = Arc::new(vec![[0, 0, 0], [1, 0, -1], [0, 2, 0], [1, 1, 0]]);
    let pos = (
        rand_vec(9, 16).iter().map(|x| x * 3.0).collect(),
        3,
        3,
        RowDomain::Atom,
    );
    let cell = (
        vec![4.0, 0.1, 0.0, 0.3, 5.0, 0.2, -0.1, 0.4, 6.0],
        3,
        3,
        RowDomain::System,
    );
    let eps = (
        rand_vec(9, 17).iter().map(|x| x * 0.01).collect(),
        1,
        9,
        RowDomain::System,
    );
    let inputs = vec![pos, cell, eps];
    // Vectors and their norms.
    let arrays: EdgeArrays = (ci, ni, shifts);
    let same = arrays.clone();
    check(inputs.clone(), &move |g, t| {
        let edges = strained_edges(g, t, &same)?;
        let v = edges.vectors(g)?;
        let d = g.row_norm(v)?;
        g.concat_cols(&[v, d])
    });
    // Lengths straight from the positions, without vectors.
    check(inputs, &move |g, t| {
        strained_edges(g, t, &arrays)?.lengths(g)
    });
}

/// A random periodic neighbour graph of `n_atoms` atoms and `n_edges` edges
/// grouped by centre, as pair lists are, with periodic shifts (self-images
/// among them) and atom 1 sitting on atom 0 (zero-length edges): positions,
/// cell, strain and the edge arrays.
fn random_periodic_graph(
    n_atoms: usize,
    n_edges: usize,
    seed: u64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, EdgeArrays) {
    let picks = rand_vec(2 * n_edges, seed);
    let atom = |x: f64| (((x + 1.0) * 0.5 * n_atoms as f64) as u32).min(n_atoms as u32 - 1);
    let mut pairs: Vec<(u32, u32)> = (0..n_edges)
        .map(|e| (atom(picks[2 * e]), atom(picks[2 * e + 1])))
        .collect();
    pairs.sort_by_key(|p| p.0);
    let ci = Arc::new(pairs.iter().map(|p| p.0).collect());
    let ni = Arc::new(pairs.iter().map(|p| p.1).collect());
    let shift_draws = rand_vec(3 * n_edges, seed + 1);
    let shifts = Arc::new(
        shift_draws
            .chunks(3)
            .map(|s| [0, 1, 2].map(|k| (s[k] * 1.6).round() as i32))
            .collect(),
    );
    let mut positions: Vec<f64> = rand_vec(3 * n_atoms, seed + 2)
        .iter()
        .map(|x| x * 9.0)
        .collect();
    positions.copy_within(0..3, 3);
    let cell = vec![9.0, 0.2, 0.0, 0.1, 8.5, 0.3, -0.2, 0.1, 9.5];
    let eps: Vec<f64> = rand_vec(9, seed + 3).iter().map(|x| x * 0.01).collect();
    (positions, cell, eps, (ci, ni, shifts))
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Values and the gradients of positions, cell and strain for `weights`.
type Outcome = (Vec<f64>, Vec<Vec<f64>>);

/// `build(g, edges, fused)` on the graph of [`random_periodic_graph`], fused
/// and unfused, on pools of one and of three threads: `(threads, fused,
/// unfused)` for each.
fn fused_and_unfused(
    graph: &(Vec<f64>, Vec<f64>, Vec<f64>, EdgeArrays),
    weights: &[f64],
    build: impl Fn(&mut Graph<f64>, &Edges, bool) -> Tensor + Sync,
) -> Vec<(usize, Outcome, Outcome)> {
    let (positions, cell, eps, arrays) = graph;
    let run = |fused: bool| -> Outcome {
        let mut g = Graph::<f64>::new();
        let t = [
            g.leaf(positions.clone(), positions.len() / 3, 3, RowDomain::Atom),
            g.leaf(cell.clone(), 3, 3, RowDomain::System),
            g.leaf(eps.clone(), 1, 9, RowDomain::System),
        ];
        let edges = strained_edges(&mut g, &t, arrays).unwrap();
        let out = build(&mut g, &edges, fused);
        let value = g.value(out).to_vec();
        let grads = g.grad(out, Some(weights.to_vec()), &t).unwrap();
        (value, grads)
    };
    [1, 3]
        .into_iter()
        .map(|threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (fused, unfused) = pool.install(|| (run(true), run(false)));
            (threads, fused, unfused)
        })
        .collect()
}

/// `edge_lengths` gives `row_norm(edge_vectors)` bit for bit, forward and
/// backward, on the one-thread path (source order) and the parallel one
/// (merged inverse maps), with self-images and coincident atoms.
#[test]
fn edge_lengths_equal_norms_of_edge_vectors_bit_for_bit() {
    let (n_atoms, n_edges) = (400, 9000); // 27,000 vector elements: past the parallel threshold
    let graph = random_periodic_graph(n_atoms, n_edges, 5);
    let weights = rand_vec(n_edges, 9);
    let runs = fused_and_unfused(&graph, &weights, |g, edges, fused| {
        if fused {
            edges.lengths(g).unwrap()
        } else {
            let v = edges.vectors(g).unwrap();
            g.row_norm(v).unwrap()
        }
    });
    for (threads, fused, unfused) in runs {
        assert!(fused.0.contains(&0.0), "no coincident pair drawn");
        assert_eq!(
            bits(&fused.0),
            bits(&unfused.0),
            "{threads} threads: lengths"
        );
        for (k, (a, b)) in fused.1.iter().zip(&unfused.1).enumerate() {
            assert_eq!(bits(a), bits(b), "{threads} threads: gradient of input {k}");
        }
    }
}

/// A pair term finite at r = 0 (coincident atoms): `e^{−r/2}·(r² + 0.3) − 1/(r + 2)`.
fn pair_term() -> Pointwise {
    let mut e = Pointwise::new("test_pair", 1);
    let r = e.input(0);
    let decay = e.unary(r, Unary::Scale(-0.5));
    let decay = e.unary(decay, Unary::Exp);
    let r2 = e.unary(r, Unary::Square);
    let r2 = e.unary(r2, Unary::AddScalar(0.3));
    let bump = e.mul(decay, r2);
    let tail = e.unary(r, Unary::AddScalar(2.0));
    let tail = e.unary(tail, Unary::Recip);
    e.sub(bump, tail);
    e
}

/// `pair_sum` gives `scatter_add(pointwise([lengths], f), center)` bit for
/// bit — values and the gradients of positions, cell and strain — on the
/// one-thread path and through the inverse maps on three threads.
#[test]
fn pair_sum_equals_the_unfused_chain_bit_for_bit() {
    let (n_atoms, n_edges) = (500, 20_000); // past the parallel threshold per edge
    let graph = random_periodic_graph(n_atoms, n_edges, 11);
    let weights = rand_vec(n_atoms, 15);
    let expr = pair_term();
    let runs = fused_and_unfused(&graph, &weights, |g, edges, fused| {
        if fused {
            g.pair_sum(edges, &expr).unwrap()
        } else {
            let lengths = edges.lengths(g).unwrap();
            let terms = g.pointwise(&[lengths], &expr).unwrap();
            g.scatter_add(terms, edges.center).unwrap()
        }
    });
    for (threads, fused, unfused) in runs {
        assert_eq!(fused.0.len(), n_atoms);
        assert!(fused.0.iter().any(|&x| x != 0.0));
        assert_eq!(bits(&fused.0), bits(&unfused.0), "{threads} threads: sums");
        for (k, (a, b)) in fused.1.iter().zip(&unfused.1).enumerate() {
            assert!(a.iter().any(|&x| x != 0.0), "gradient of input {k} is zero");
            assert_eq!(bits(a), bits(b), "{threads} threads: gradient of input {k}");
        }
    }
}

/// `pair_sum`'s gradients against finite differences, and its refusal of
/// an expression that does not take exactly the length.
#[test]
fn pair_sum_gradients_and_errors() {
    let (positions, cell, eps, arrays) = random_periodic_graph(7, 40, 21);
    let inputs = vec![
        (positions, 7, 3, RowDomain::Atom),
        (cell, 3, 3, RowDomain::System),
        (eps, 1, 9, RowDomain::System),
    ];
    let same = arrays.clone();
    check(inputs, &move |g, t| {
        let edges = strained_edges(g, t, &same)?;
        g.pair_sum(&edges, &pair_term())
    });
    let mut g = Graph::<f64>::new();
    let t = [
        g.leaf(vec![0.0; 21], 7, 3, RowDomain::Atom),
        g.leaf(
            vec![9.0, 0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 9.0],
            3,
            3,
            RowDomain::System,
        ),
        g.leaf(vec![0.0; 9], 1, 9, RowDomain::System),
    ];
    let edges = strained_edges(&mut g, &t, &arrays).unwrap();
    let mut two = Pointwise::new("two_inputs", 2);
    let (a, b) = (two.input(0), two.input(1));
    two.add(a, b);
    let err = g.pair_sum(&edges, &two).unwrap_err().to_string();
    assert!(err.contains("takes 2 inputs"), "{err}");
    // Positions with fewer rows than the edges point into: an error naming
    // the index, not an out-of-bounds read.
    let few = g.leaf(vec![0.0; 9], 3, 3, RowDomain::Atom);
    let (ci, ni, _) = &arrays;
    let i = g.index(
        ci.clone(),
        RowDomain::Edge,
        RowDomain::Atom,
        7,
        "edge_center",
    );
    let j = g.index(
        ni.clone(),
        RowDomain::Edge,
        RowDomain::Atom,
        7,
        "edge_neighbor",
    );
    let err = g
        .edge_lengths(few, i.unwrap(), j.unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`edge_center` points into 7 rows"), "{err}");
}

#[test]
fn radial_bases_and_cutoffs() {
    use ddmlip_engine::ops::Radial;
    let d = (vec![0.9, 1.7, 2.5, 3.3, 4.4, 4.9], 6, 1, RowDomain::Edge);
    for f in [
        Radial::Gaussian {
            centers: vec![0.5, 1.5, 2.5, 3.5],
            gamma: 2.0,
        },
        Radial::Bessel { n: 5, cutoff: 5.0 },
        Radial::CosineCutoff { cutoff: 4.0 },
        Radial::PolynomialCutoff { cutoff: 4.0, p: 6 },
    ] {
        check(vec![d.clone()], &move |g, t| g.radial(t[0], f.clone()));
    }
}

#[test]
fn shape_ops() {
    check(vec![atoms(3, 4, 18), atoms(3, 2, 19)], &|g, t| {
        let c = g.concat_cols(&[t[0], t[1]])?;
        let s = g.slice_cols(c, 1, 5)?;
        let a = g.sum_cols(s)?;
        let b = g.sum_rows(c)?;
        let b = g.sum_cols(b)?;
        g.mul(a, b)
    });
}

/// `y = x³` with a user backward. An adding cube (`Cube::ADDING`) adds
/// into the zeroed buffers the engine gives by default; an assigning one
/// says it assigns (`writes_every_output`, `backward_assigns`) and assigns
/// `covers` of each buffer: all of it when it keeps its word.
struct Cube {
    assigns: bool,
    covers: f64,
}
impl Cube {
    const ADDING: Cube = Cube {
        assigns: false,
        covers: 1.0,
    };
}
impl OpaqueKernel<f64> for Cube {
    fn name(&self) -> &str {
        "cube"
    }
    fn output_shape(
        &self,
        inputs: &[(RowDomain, usize, usize)],
    ) -> Result<(RowDomain, usize, usize), ddmlip_engine::KernelError> {
        Ok(inputs[0])
    }
    fn forward(
        &self,
        inputs: &[&[f64]],
        _s: &[(RowDomain, usize, usize)],
        out: &mut [f64],
    ) -> Result<(), ddmlip_engine::KernelError> {
        let n = (out.len() as f64 * self.covers) as usize;
        for (o, x) in out[..n].iter_mut().zip(inputs[0]) {
            *o = x * x * x;
        }
        Ok(())
    }
    fn backward(
        &self,
        inputs: &[&[f64]],
        _s: &[(RowDomain, usize, usize)],
        g: &[f64],
        grads: &mut [Vec<f64>],
    ) -> Option<Result<(), ddmlip_engine::KernelError>> {
        let n = (g.len() as f64 * self.covers) as usize;
        for i in 0..n {
            let d = 3.0 * inputs[0][i] * inputs[0][i] * g[i];
            grads[0][i] = if self.assigns { d } else { grads[0][i] + d };
        }
        Some(Ok(()))
    }
    fn writes_every_output(&self) -> bool {
        self.assigns
    }
    fn backward_assigns(&self) -> bool {
        self.assigns
    }
}

#[test]
fn opaque_op_with_user_backward() {
    check(vec![atoms(4, 2, 20)], &|g, t| {
        g.opaque(Arc::new(Cube::ADDING), &[t[0]])
    });
}

/// A kernel that assigns gets unzeroed buffers, forward and backward, in
/// evaluations that recycle the previous one's memory: its values and
/// gradients equal the adding kernel's, and its gradient, added to an
/// input's gradient from another reader, is added, not overwritten. A
/// kernel that claims to assign and leaves elements unwritten reads NaN
/// there in builds with debug assertions (where the tests run).
#[test]
fn kernels_that_assign_get_unzeroed_buffers_and_are_held_to_it() {
    let (rows, cols) = (3000, 8);
    let x0 = rand_vec(rows * cols, 71);
    let seed = rand_vec(rows * cols, 72);
    // One evaluation on a graph made from `buffers`, which it gives back
    // (the runtime's pattern across steps: recycled memory, stale content).
    let run = |buffers: &mut Option<Buffers<f64>>, kernel: Arc<dyn OpaqueKernel<f64>>| {
        let mut g = Graph::with_buffers(buffers.take().unwrap_or_default());
        let x = g.leaf(x0.clone(), rows, cols, RowDomain::Atom);
        let y = g.rowwise(kernel, &[x]).unwrap();
        // x has a second reader, so the kernel's gradient is added to it.
        let z = g.add(y, x).unwrap();
        let grads = g.grad(z, Some(seed.clone()), &[x]).unwrap();
        let out = (g.value(y).to_vec(), grads[0].clone());
        *buffers = Some(g.into_buffers());
        out
    };
    let mut buffers = None;
    let want = run(&mut buffers, Arc::new(Cube::ADDING));
    for k in 0..3 {
        let got = run(
            &mut buffers,
            Arc::new(Cube {
                assigns: true,
                covers: 1.0,
            }),
        );
        assert_eq!(bits(&got.0), bits(&want.0), "values, evaluation {k}");
        assert_eq!(bits(&got.1), bits(&want.1), "gradient, evaluation {k}");
    }
    let lying = run(
        &mut buffers,
        Arc::new(Cube {
            assigns: true,
            covers: 0.5,
        }),
    );
    if cfg!(debug_assertions) {
        assert!(
            lying.0[rows * cols - 1].is_nan(),
            "an unwritten output element"
        );
        assert!(
            lying.1[rows * cols - 1].is_nan(),
            "an unwritten gradient element"
        );
    }
}

struct NoBackward;
impl OpaqueKernel<f64> for NoBackward {
    fn name(&self) -> &str {
        "frozen"
    }
    fn output_shape(
        &self,
        inputs: &[(RowDomain, usize, usize)],
    ) -> Result<(RowDomain, usize, usize), ddmlip_engine::KernelError> {
        Ok(inputs[0])
    }
    fn forward(
        &self,
        inputs: &[&[f64]],
        _s: &[(RowDomain, usize, usize)],
        out: &mut [f64],
    ) -> Result<(), ddmlip_engine::KernelError> {
        out.copy_from_slice(inputs[0]);
        Ok(())
    }
}

#[test]
fn opaque_op_without_backward_reports_severed_path() {
    let mut g = Graph::<f64>::new();
    let x = g.leaf(vec![1.0, 2.0], 2, 1, RowDomain::Atom);
    let y = g.opaque(Arc::new(NoBackward), &[x]).unwrap();
    let err = g.grad(y, None, &[x]).unwrap_err();
    assert!(err.to_string().contains("frozen"), "{err}");
    assert!(err.to_string().contains("severed"), "{err}");
}

#[test]
fn f32_graph_agrees_with_f64() {
    let x: Vec<f64> = rand_vec(20, 21);
    let mut g64 = Graph::<f64>::new();
    let a = g64.leaf(x.clone(), 5, 4, RowDomain::Atom);
    let b = g64.silu(a).unwrap();
    let c = g64.sum_cols(b).unwrap();
    let ga = g64.grad(c, None, &[a]).unwrap();
    let mut g32 = Graph::<f32>::new();
    let a32 = g32.leaf(x.iter().map(|&v| v as f32).collect(), 5, 4, RowDomain::Atom);
    let b32 = g32.silu(a32).unwrap();
    let c32 = g32.sum_cols(b32).unwrap();
    let ga32 = g32.grad(c32, None, &[a32]).unwrap();
    for (p, q) in ga[0].iter().zip(&ga32[0]) {
        assert!((p - *q as f64).abs() < 1e-6);
    }
}

#[test]
fn trace_records_ops_indices_and_backward() {
    let mut g = Graph::<f64>::new();
    g.enable_trace();
    let x = g.leaf(rand_vec(6, 22), 3, 2, RowDomain::Atom);
    let i = g
        .index(
            Arc::new(vec![0, 1, 2, 0]),
            RowDomain::Edge,
            RowDomain::Atom,
            3,
            "edge_center",
        )
        .unwrap();
    let j = g
        .index(
            Arc::new(vec![1, 2, 0, 2]),
            RowDomain::Edge,
            RowDomain::Atom,
            3,
            "edge_neighbor",
        )
        .unwrap();
    let m = g.gather(x, j).unwrap();
    let s = g.scatter_add(m, i).unwrap();
    let _ = g.grad(s, None, &[x]).unwrap();
    let tr = g.trace().unwrap();
    let ops: Vec<&str> = tr.events.iter().map(|e| e.op.as_str()).collect();
    assert!(
        ops.contains(&"gather")
            && ops.contains(&"scatter_add")
            && ops.contains(&"scatter_add.backward"),
        "{ops:?}"
    );
    let sc = tr.events.iter().find(|e| e.op == "scatter_add").unwrap();
    assert_eq!(sc.indices, vec!["edge_center (Edge → Atom)".to_string()]);
    assert_eq!(sc.output.domain, RowDomain::Atom);
    assert!(tr.to_json().contains("\"scatter_add\""));
    assert!(tr.render().contains("by edge_neighbor"));
}

#[test]
fn finite_checks_name_the_op() {
    let mut g = Graph::<f64>::new();
    g.enable_finite_checks();
    let x = g.leaf(vec![-1.0, 2.0], 2, 1, RowDomain::Atom);
    let err = g.unary(x, Unary::Sqrt).unwrap_err();
    assert!(err.to_string().contains("sqrt"), "{err}");
}

/// out[i] = Σ_e w_e · tanh(h[j]) — a message kernel with a hand-written backward.
struct TanhMessage;
impl ddmlip_engine::MessageKernel<f64> for TanhMessage {
    fn name(&self) -> &str {
        "tanh_message"
    }
    fn out_cols(&self) -> usize {
        2
    }
    fn forward(
        &self,
        x: &ddmlip_engine::MessageInputs<'_, f64>,
        out: &mut [f64],
    ) -> Result<(), ddmlip_engine::KernelError> {
        for e in 0..x.center.len() {
            let (i, j) = (x.center[e] as usize, x.neighbor[e] as usize);
            for c in 0..2 {
                out[i * 2 + c] += x.edges[0][e] * x.nodes[0][j * 2 + c].tanh();
            }
        }
        Ok(())
    }
    // Index-parallel arrays (centre, neighbour, edge weight) read clearest by index.
    #[allow(clippy::needless_range_loop)]
    fn backward(
        &self,
        x: &ddmlip_engine::MessageInputs<'_, f64>,
        g: &[f64],
        gn: &mut [Vec<f64>],
        ge: &mut [Vec<f64>],
    ) -> Result<(), ddmlip_engine::KernelError> {
        for e in 0..x.center.len() {
            let (i, j) = (x.center[e] as usize, x.neighbor[e] as usize);
            for c in 0..2 {
                let t = x.nodes[0][j * 2 + c].tanh();
                gn[0][j * 2 + c] += g[i * 2 + c] * x.edges[0][e] * (1.0 - t * t);
                ge[0][e] += g[i * 2 + c] * t;
            }
        }
        Ok(())
    }
}

#[test]
fn fused_message_passing_and_rowwise() {
    let ci: Arc<Vec<u32>> = Arc::new(vec![0, 0, 1, 2, 2]);
    let ni: Arc<Vec<u32>> = Arc::new(vec![1, 2, 0, 0, 1]);
    check(
        vec![atoms(3, 2, 30), (rand_vec(5, 31), 5, 1, RowDomain::Edge)],
        &move |g, t| {
            let c = g.index(
                ci.clone(),
                RowDomain::Edge,
                RowDomain::Atom,
                3,
                "edge_center",
            )?;
            let n = g.index(
                ni.clone(),
                RowDomain::Edge,
                RowDomain::Atom,
                3,
                "edge_neighbor",
            )?;
            let m = g.message_passing(Arc::new(TanhMessage), &[t[0]], &[t[1]], c, n)?;
            g.rowwise(Arc::new(Cube::ADDING), &[m])
        },
    );
}

/// A two-input expression that reuses registers and uses every binary kind:
/// (a·b − a/(b²+1))·exp(−a) + 0.5·b.
fn mixed_expression() -> ddmlip_engine::ops::Pointwise {
    let mut e = ddmlip_engine::ops::Pointwise::new("mixed", 2);
    let (a, b) = (e.input(0), e.input(1));
    let ab = e.mul(a, b);
    let b2 = e.unary(b, Unary::Square);
    let one = e.constant(1.0);
    let den = e.add(b2, one);
    let q = e.div(a, den);
    let d = e.sub(ab, q);
    let na = e.unary(a, Unary::Neg);
    let ex = e.unary(na, Unary::Exp);
    let p = e.mul(d, ex);
    let hb = e.unary(b, Unary::Scale(0.5));
    e.add(p, hb);
    e
}

#[test]
fn pointwise_matches_finite_differences() {
    let expr = mixed_expression();
    check(vec![atoms(5, 3, 21), atoms(5, 3, 22)], &move |g, t| {
        g.pointwise(t, &expr)
    });
    // Long enough for several blocks and the parallel path.
    let expr = mixed_expression();
    let n = 70_000;
    let (a, b) = (rand_vec(n, 23), rand_vec(n, 24));
    let fused = {
        let mut g = Graph::<f64>::new();
        let (ta, tb) = (
            g.leaf(a.clone(), n, 1, RowDomain::Edge),
            g.leaf(b.clone(), n, 1, RowDomain::Edge),
        );
        let y = g.pointwise(&[ta, tb], &expr).unwrap();
        let w = rand_vec(n, 25);
        let grads = g.grad(y, Some(w), &[ta, tb]).unwrap();
        (g.value(y).to_vec(), grads)
    };
    let separate = {
        let mut g = Graph::<f64>::new();
        let (ta, tb) = (
            g.leaf(a.clone(), n, 1, RowDomain::Edge),
            g.leaf(b.clone(), n, 1, RowDomain::Edge),
        );
        let ab = g.mul(ta, tb).unwrap();
        let b2 = g.unary(tb, Unary::Square).unwrap();
        let den = g.unary(b2, Unary::AddScalar(1.0)).unwrap();
        let q = g.div(ta, den).unwrap();
        let d = g.sub(ab, q).unwrap();
        let na = g.unary(ta, Unary::Neg).unwrap();
        let ex = g.unary(na, Unary::Exp).unwrap();
        let p = g.mul(d, ex).unwrap();
        let hb = g.scale(tb, 0.5).unwrap();
        let y = g.add(p, hb).unwrap();
        let w = rand_vec(n, 25);
        let grads = g.grad(y, Some(w), &[ta, tb]).unwrap();
        (g.value(y).to_vec(), grads)
    };
    // Same operations in the same order: the values agree bit for bit.
    assert_eq!(fused.0, separate.0);
    for (gf, gs) in fused.1.iter().zip(&separate.1) {
        for (x, y) in gf.iter().zip(gs) {
            assert!((x - y).abs() <= 1e-14 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}

#[test]
fn pointwise_rejects_bad_expressions() {
    use ddmlip_engine::ops::Pointwise;
    let mut g = Graph::<f64>::new();
    let x = g.leaf(vec![1.0; 6], 3, 2, RowDomain::Atom);
    let y = g.leaf(vec![1.0; 3], 3, 1, RowDomain::Atom);
    // Too many steps.
    let mut long = Pointwise::new("long", 1);
    let mut r = long.input(0);
    for _ in 0..Pointwise::MAX_STEPS {
        r = long.unary(r, Unary::Neg);
    }
    let err = g.pointwise(&[x], &long).unwrap_err().to_string();
    assert!(err.contains("steps"), "{err}");
    // Input count and shapes.
    let two = mixed_expression();
    let err = g.pointwise(&[x], &two).unwrap_err().to_string();
    assert!(err.contains("2 inputs"), "{err}");
    let err = g.pointwise(&[x, y], &two).unwrap_err().to_string();
    assert!(err.contains("3×2 and 3×1"), "{err}");
    // No inputs at all.
    let none = Pointwise::new("none", 0);
    assert!(g.pointwise(&[], &none).is_err());
}

/// Row norms of widths other than the edge vectors' three, alone (the
/// gradient is written) and next to another use of the same rows (it is
/// added); a zero row has a zero gradient by convention, not NaN.
#[test]
fn row_norm_of_any_width() {
    for cols in [1usize, 2, 4, 7] {
        let rows = 5;
        let x = (
            rand_vec(rows * cols, cols as u64),
            rows,
            cols,
            RowDomain::Edge,
        );
        check(vec![x.clone()], &|g, t| g.row_norm(t[0]));
        check(vec![x], &|g, t| {
            let n = g.row_norm(t[0])?;
            g.concat_cols(&[t[0], n])
        });
    }
    let mut g = Graph::<f64>::new();
    let x = g.leaf(vec![0.0, 0.0, 3.0, 4.0], 2, 2, RowDomain::Edge);
    let n = g.row_norm(x).unwrap();
    assert_eq!(g.value(n), &[0.0, 5.0]);
    let gx = g.grad(n, Some(vec![1.0, 1.0]), &[x]).unwrap();
    assert_eq!(&gx[0][..2], &[0.0, 0.0]);
    assert!((gx[0][2] - 0.6).abs() < 1e-15 && (gx[0][3] - 0.8).abs() < 1e-15);
}

/// With ranks able to help each other, `pair_sum`'s one-thread gradient
/// runs in pieces: the same bits whether other threads ran some pieces or
/// none, and the sums of the one-pass gradient up to rounding.
#[test]
fn pair_sum_gradient_in_pieces_is_the_same_whoever_runs_them() {
    // Past two pieces' worth of edges (2^18 each).
    let (n_atoms, n_edges) = (3000, 600_000);
    let (positions, cell, eps, arrays) = random_periodic_graph(n_atoms, n_edges, 31);
    let weights = rand_vec(n_atoms, 33);
    let run = || -> Outcome {
        let mut g = Graph::<f64>::new();
        let t = [
            g.leaf(positions.clone(), n_atoms, 3, RowDomain::Atom),
            g.leaf(cell.clone(), 3, 3, RowDomain::System),
            g.leaf(eps.clone(), 1, 9, RowDomain::System),
        ];
        let edges = strained_edges(&mut g, &t, &arrays).unwrap();
        let out = g.pair_sum(&edges, &pair_term()).unwrap();
        let value = g.value(out).to_vec();
        let grads = g.grad(out, Some(weights.clone()), &t).unwrap();
        (value, grads)
    };
    let (one_pass, alone, helped_run) = runs_with_and_without_helpers(&run);
    assert_eq!(bits(&alone.0), bits(&helped_run.0), "sums");
    assert_eq!(
        bits(&alone.0),
        bits(&one_pass.0),
        "sums do not depend on pieces"
    );
    for (k, ((a, b), c)) in alone
        .1
        .iter()
        .zip(&helped_run.1)
        .zip(&one_pass.1)
        .enumerate()
    {
        assert_eq!(
            bits(a),
            bits(b),
            "gradient of input {k}: helpers changed bits"
        );
        let scale = c.iter().fold(0.0_f64, |m, x| m.max(x.abs()));
        assert!(scale > 0.0, "gradient of input {k} is zero");
        let worst = a
            .iter()
            .zip(c)
            .fold(0.0_f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-12 * scale,
            "input {k}: pieces vs one pass {worst:e}"
        );
    }
}

/// `run` on a one-thread pool three ways: without a board, with a board
/// nobody helps on, and with three threads helping on the board (repeated
/// until a helper ran a piece; panics if none ever did).
fn runs_with_and_without_helpers(
    run: &(dyn Fn() -> Outcome + Sync),
) -> (Outcome, Outcome, Outcome) {
    use ddmlip_engine::helpers::{with_board, HelpBoard};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let one_pass = one_thread.install(run);
    let alone = one_thread.install(|| with_board(HelpBoard::new(), run));
    let board = HelpBoard::new();
    let (stop, helped) = (AtomicBool::new(false), AtomicUsize::new(0));
    let helped_run = std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    if board.help() {
                        helped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        // Until a helper took a piece: a run where none did proves nothing.
        let mut out = one_thread.install(|| with_board(board.clone(), run));
        for _ in 0..20 {
            if helped.load(Ordering::Relaxed) > 0 {
                break;
            }
            out = one_thread.install(|| with_board(board.clone(), run));
        }
        stop.store(true, Ordering::Release);
        out
    });
    assert!(helped.load(Ordering::Relaxed) > 0, "no helper ran a piece");
    (one_pass, alone, helped_run)
}

/// Row-wise ops (element-wise, matmul, gather, scatter through the inverse
/// map) split into pieces when ranks can help: a message-passing chain
/// gives the same bits with and without pieces, whoever runs them.
#[test]
fn row_ops_in_pieces_give_the_same_bits_whoever_runs_them() {
    // Enough rows for many pieces of 2^17 elements: 40,000 edges × 32.
    let (n_atoms, n_edges, width) = (5000, 40_000, 32);
    let centers = rand_vec(n_edges, 41);
    let neighbors = rand_vec(n_edges, 42);
    let mut center: Vec<u32> = centers
        .iter()
        .map(|&x| ((x.abs() * 1e6) as usize % n_atoms) as u32)
        .collect();
    center.sort_unstable();
    let neighbor: Vec<u32> = neighbors
        .iter()
        .map(|&x| ((x.abs() * 1e6) as usize % n_atoms) as u32)
        .collect();
    let (center, neighbor) = (Arc::new(center), Arc::new(neighbor));
    let x0 = rand_vec(n_atoms * width, 43);
    let filter0 = rand_vec(n_edges * width, 44);
    let w0 = rand_vec(width * width, 45);
    let weights = rand_vec(n_atoms * width, 46);
    let run = || -> Outcome {
        let mut g = Graph::<f64>::new();
        let t = [
            g.leaf(x0.clone(), n_atoms, width, RowDomain::Atom),
            g.leaf(filter0.clone(), n_edges, width, RowDomain::Edge),
            g.leaf(w0.clone(), width, width, RowDomain::System),
        ];
        let c = g
            .index(
                center.clone(),
                RowDomain::Edge,
                RowDomain::Atom,
                n_atoms,
                "edge_center",
            )
            .unwrap();
        let n = g
            .index(
                neighbor.clone(),
                RowDomain::Edge,
                RowDomain::Atom,
                n_atoms,
                "edge_neighbor",
            )
            .unwrap();
        let mut x = t[0];
        for _ in 0..2 {
            let xl = g.matmul(x, t[2]).unwrap();
            let xj = g.gather(xl, n).unwrap();
            let filter = g.shifted_softplus(t[1]).unwrap();
            let m = g.mul(xj, filter).unwrap();
            let agg = g.scatter_add(m, c).unwrap();
            let v = g.tanh(agg).unwrap();
            x = g.add(x, v).unwrap();
        }
        let value = g.value(x).to_vec();
        let grads = g.grad(x, Some(weights.clone()), &t).unwrap();
        (value, grads)
    };
    let (one_pass, alone, helped) = runs_with_and_without_helpers(&run);
    for (name, other) in [("a board nobody helps on", &alone), ("helpers", &helped)] {
        assert_eq!(bits(&one_pass.0), bits(&other.0), "values with {name}");
        for (k, (a, b)) in one_pass.1.iter().zip(&other.1).enumerate() {
            assert!(a.iter().any(|v| *v != 0.0), "gradient of input {k} is zero");
            assert_eq!(bits(a), bits(b), "gradient of input {k} with {name}");
        }
    }
}

/// Column slices, concatenation and row/column sums on tensors large enough
/// to be split into parts (and pieces that other ranks may run), against a
/// naive reference: `y = concat(x[:, 2..5], sum_cols(x), x)` (a slice,
/// a per-row sum, and `x` itself, so `x`'s gradient gathers three adds)
/// and `sum_rows(x)`, whose gradients for random seeds are written out by
/// hand. Every run — one pass, pieces alone, pieces helped — gives the
/// reference's bits.
#[test]
fn large_shape_ops_equal_a_naive_reference() {
    let (rows, cols) = (60_011, 7);
    let x0 = rand_vec(rows * cols, 61);
    let wy = rand_vec(rows * (3 + 1 + cols), 62);
    let ws = rand_vec(cols, 63);
    let run = || -> Outcome {
        let mut g = Graph::<f64>::new();
        let x = g.leaf(x0.clone(), rows, cols, RowDomain::Atom);
        let a = g.slice_cols(x, 2, 5).unwrap();
        let b = g.sum_cols(x).unwrap();
        let y = g.concat_cols(&[a, b, x]).unwrap();
        let s = g.sum_rows(x).unwrap();
        let gy = g.grad(y, Some(wy.clone()), &[x]).unwrap();
        let gs = g.grad(s, Some(ws.clone()), &[x]).unwrap();
        let mut value = g.value(y).to_vec();
        value.extend_from_slice(g.value(s));
        (value, vec![gy[0].clone(), gs[0].clone()])
    };
    // The reference, element by element.
    let w = 3 + 1 + cols;
    let mut y = vec![0.0; rows * w];
    let mut gy = vec![0.0; rows * cols];
    let mut s = vec![0.0; cols];
    for r in 0..rows {
        let xr = &x0[r * cols..(r + 1) * cols];
        let (yr, wr) = (&mut y[r * w..(r + 1) * w], &wy[r * w..(r + 1) * w]);
        yr[..3].copy_from_slice(&xr[2..5]);
        yr[3] = xr.iter().copied().sum();
        yr[4..].copy_from_slice(xr);
        for c in 0..cols {
            s[c] += xr[c];
            // Gradients arrive in the tape's reverse order: x itself
            // (concat), then the row sum, then the slice.
            let mut gc = wr[4 + c] + wr[3];
            if (2..5).contains(&c) {
                gc += wr[c - 2];
            }
            gy[r * cols + c] = gc;
        }
    }
    y.extend_from_slice(&s);
    let gs: Vec<f64> = (0..rows * cols).map(|i| ws[i % cols]).collect();
    let (one_pass, alone, helped) = runs_with_and_without_helpers(&run);
    for (name, got) in [
        ("one pass", &one_pass),
        ("pieces alone", &alone),
        ("helpers", &helped),
    ] {
        assert_eq!(bits(&got.0), bits(&y), "values, {name}");
        assert_eq!(
            bits(&got.1[0]),
            bits(&gy),
            "gradient through the concatenation, {name}"
        );
        assert_eq!(
            bits(&got.1[1]),
            bits(&gs),
            "gradient of the column sums, {name}"
        );
    }
}

/// Binary ops on tensors large enough to be split into parts and gradient
/// blocks whose boundaries fall inside rows, against a naive element-wise
/// reference: the same bits forward, and the same bits for the gradient of
/// `Σ w ⊙ op(a, b) + Σ v ⊙ a` with respect to `a` (so `a`'s gradient is
/// added into one that already exists) and, unbroadcast or per row, to `b`.
#[test]
fn large_binary_ops_equal_an_element_wise_reference() {
    #[derive(Clone, Copy, Debug)]
    enum Kind {
        Add,
        Sub,
        Mul,
        Div,
    }
    for (rows, cols) in [(3001, 7), (4099, 1), (1, 9000), (2500, 33)] {
        let a = rand_vec(rows * cols, 21);
        let w = rand_vec(rows * cols, 22);
        let v = rand_vec(rows * cols, 23);
        let shapes = [(rows, cols), (rows, 1), (1, cols), (1, 1)];
        for (s, &(rb, cb)) in shapes.iter().enumerate() {
            let b: Vec<f64> = rand_vec(rb * cb, 24 + s as u64)
                .iter()
                .map(|x| x + 2.5)
                .collect();
            let bidx = |i: usize| match (rb == rows, cb == cols) {
                (true, true) => i,
                (true, false) => i / cols,
                (false, true) => i % cols,
                (false, false) => 0,
            };
            for kind in [Kind::Add, Kind::Sub, Kind::Mul, Kind::Div] {
                let op = |x: f64, y: f64| match kind {
                    Kind::Add => x + y,
                    Kind::Sub => x - y,
                    Kind::Mul => x * y,
                    Kind::Div => x / y,
                };
                let mut g = Graph::<f64>::new();
                let ta = g.leaf(a.clone(), rows, cols, RowDomain::Atom);
                let b_domain = if rb == rows {
                    RowDomain::Atom
                } else {
                    RowDomain::None
                };
                let tb = g.leaf(b.clone(), rb, cb, b_domain);
                let y = match kind {
                    Kind::Add => g.add(ta, tb),
                    Kind::Sub => g.sub(ta, tb),
                    Kind::Mul => g.mul(ta, tb),
                    Kind::Div => g.div(ta, tb),
                }
                .unwrap();
                let what = format!("{kind:?} {rows}x{cols} with b {rb}x{cb}");
                for (i, &got) in g.value(y).iter().enumerate() {
                    let want = op(a[i], b[bidx(i)]);
                    assert_eq!(got.to_bits(), want.to_bits(), "{what}: element {i}");
                }
                // L = Σ w ⊙ y + Σ v ⊙ a: a's gradient gets v first or last.
                let wy = g.leaf(w.clone(), rows, cols, RowDomain::Atom);
                let wv = g.leaf(v.clone(), rows, cols, RowDomain::Atom);
                let l1 = g.mul(y, wy).unwrap();
                let l2 = g.mul(ta, wv).unwrap();
                let l = g.add(l1, l2).unwrap();
                let ones = vec![1.0; rows * cols];
                let grads = g.grad(l, Some(ones), &[ta, tb]).unwrap();
                let term = |i: usize| match kind {
                    Kind::Add => w[i],
                    Kind::Sub => -w[i],
                    Kind::Mul => w[i] * a[i],
                    Kind::Div => -w[i] * a[i] / (b[bidx(i)] * b[bidx(i)]),
                };
                if (rb, cb) == (rows, 1) && cols > 1 {
                    // A per-row b: each row's terms summed in column order.
                    for (r, &got) in grads[1].iter().enumerate() {
                        let want: f64 = (0..cols).map(|k| term(r * cols + k)).sum();
                        assert_eq!(got.to_bits(), want.to_bits(), "{what}: b's gradient {r}");
                    }
                }
                if (rb, cb) == (rows, cols) {
                    // b's gradient, element by element (no sums over rows
                    // or columns).
                    for (i, &got) in grads[1].iter().enumerate() {
                        let want = match kind {
                            Kind::Add => w[i],
                            Kind::Sub => -w[i],
                            Kind::Mul => w[i] * a[i],
                            Kind::Div => -w[i] * a[i] / (b[i] * b[i]),
                        };
                        assert_eq!(got.to_bits(), want.to_bits(), "{what}: b's gradient {i}");
                    }
                }
                for (i, &got) in grads[0].iter().enumerate() {
                    let dy = match kind {
                        Kind::Add | Kind::Sub => w[i],
                        Kind::Mul => w[i] * b[bidx(i)],
                        Kind::Div => w[i] / b[bidx(i)],
                    };
                    let want = dy + v[i];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{what}: gradient element {i}"
                    );
                }
            }
        }
    }
}
