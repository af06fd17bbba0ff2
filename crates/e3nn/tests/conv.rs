//! The fused convolution against a naive per-edge implementation with
//! materialised messages, and its gradients against finite differences.

use ddmlip_e3nn::conv::uvu_sorted_paths;
use ddmlip_e3nn::radial_table::{split_length, TableTolerance};
use ddmlip_e3nn::{
    conv_backward, conv_forward, radial_conv_backward, radial_conv_forward, sh_dim, sh_forward,
    wigner_3j, ConvGraph, ConvPaths, CutoffFunction, EdgeEmbedding, EdgeRadial, Irreps, RadialMlp,
    RadialTable,
};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
    fn below(&mut self, n: usize) -> u32 {
        (((self.next() + 1.0) / 2.0 * n as f64) as usize).min(n - 1) as u32
    }
}

/// (l1, l2, l3, mul, input offset, weight offset, output offset, CG).
type RawPath = (usize, usize, usize, usize, usize, usize, usize, Vec<f64>);

struct Setup {
    paths: ConvPaths<f64>,
    raw: Vec<RawPath>,
    n: usize,
    centers: Vec<u32>,
    neighbors: Vec<u32>,
    h: Vec<f64>,
    sh: Vec<f64>,
    w: Vec<f64>,
    lmax_sh: usize,
}

fn setup(irreps: &str, lmax_sh: usize, lmax_out: usize) -> Setup {
    let ir = Irreps::parse(irreps).unwrap();
    let mut rng = Rng(42);
    // Random CG-shaped tensors built from true wigner_3j with random signs and
    // scales per path, so that every path has distinct coefficients.
    let mut raw = Vec::new();
    let (paths, msg, _) = ConvPaths::<f64>::uvu_sorted(
        &ir,
        lmax_sh,
        |_| 1,
        |ir| ir.l <= lmax_out,
        |a, b, c| {
            let s = 0.5 + rng.next().abs();
            Ok(wigner_3j(a, b, c)?.iter().map(|v| v * s).collect())
        },
    )
    .unwrap();
    // Recover the raw description through a second, identical construction.
    let mut rng2 = Rng(42);
    let (_, _, order) = ConvPaths::<f64>::uvu_sorted(
        &ir,
        lmax_sh,
        |_| 1,
        |ir| ir.l <= lmax_out,
        |a, b, c| {
            let s = 0.5 + rng2.next().abs();
            let cg: Vec<f64> = wigner_3j(a, b, c)?.iter().map(|v| v * s).collect();
            raw.push((a, b, c, cg));
            Ok(vec![0.0; (2 * a + 1) * (2 * b + 1) * (2 * c + 1)])
        },
    )
    .unwrap();
    assert_eq!(order.len(), paths.n_paths());
    // Layout bookkeeping for the naive version, derived independently.
    let offs = ir.offsets();
    let mut created = Vec::new();
    for (b, blk) in ir.blocks.iter().enumerate() {
        for l2 in 0..=lmax_sh {
            for l3 in blk.ir.l.abs_diff(l2)..=blk.ir.l + l2 {
                if l3 <= lmax_out {
                    created.push((b, l2, l3));
                }
            }
        }
    }
    let mut sorted: Vec<usize> = (0..created.len()).collect();
    sorted.sort_by_key(|&k| created[k].2);
    let mut full = Vec::new();
    let (mut w_off, mut o_off) = (0, 0);
    // The CG callback is called once per path in sorted order.
    for (pos, &k) in sorted.iter().enumerate() {
        let (b, l2, l3) = created[k];
        let blk = ir.blocks[b];
        let (l1r, l2r, l3r, cg) = raw[pos].clone();
        assert_eq!((l1r, l2r, l3r), (blk.ir.l, l2, l3));
        full.push((blk.ir.l, l2, l3, blk.mul, offs[b], w_off, o_off, cg));
        w_off += blk.mul;
        o_off += blk.mul * (2 * l3 + 1);
    }
    assert_eq!(o_off, msg.dim());
    assert_eq!(w_off, paths.dim_w());
    // Random graph: 7 rows, 40 edges, including a row with no edges at all
    // (row 6) and repeated pairs.
    let n = 7;
    let ne = 40;
    let mut centers = Vec::new();
    let mut neighbors = Vec::new();
    for _ in 0..ne {
        centers.push(rng.below(6));
        neighbors.push(rng.below(6));
    }
    let vecs: Vec<[f64; 3]> = (0..ne)
        .map(|_| [rng.next() * 3.0, rng.next() * 3.0, rng.next() * 3.0])
        .collect();
    let mut sh = vec![0.0; ne * sh_dim(lmax_sh)];
    sh_forward(&vecs, lmax_sh, &mut sh).unwrap();
    let h = rng.vec(n * ir.dim());
    let w = rng.vec(ne * paths.dim_w());
    Setup {
        paths,
        raw: full,
        n,
        centers,
        neighbors,
        h,
        sh,
        w,
        lmax_sh,
    }
}

fn naive(s: &Setup, h: &[f64], sh: &[f64], w: &[f64], denom: f64) -> Vec<f64> {
    let (di, dm, dw, ds) = (
        s.paths.dim_in(),
        s.paths.dim_msg(),
        s.paths.dim_w(),
        sh_dim(s.lmax_sh),
    );
    let ne = s.centers.len();
    let mut msgs = vec![0.0; ne * dm];
    for e in 0..ne {
        let j = s.neighbors[e] as usize;
        for (l1, l2, l3, mul, io, wo, oo, cg) in &s.raw {
            let (d1, d2, d3) = (2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1);
            for u in 0..*mul {
                for k in 0..d3 {
                    let mut acc = 0.0;
                    for a in 0..d1 {
                        for b in 0..d2 {
                            acc += cg[(a * d2 + b) * d3 + k]
                                * h[j * di + io + u * d1 + a]
                                * sh[e * ds + l2 * l2 + b];
                        }
                    }
                    msgs[e * dm + oo + u * d3 + k] = (d3 as f64).sqrt() * w[e * dw + wo + u] * acc;
                }
            }
        }
    }
    let mut out = vec![0.0; s.n * dm];
    for e in 0..ne {
        let i = s.centers[e] as usize;
        for c in 0..dm {
            out[i * dm + c] += msgs[e * dm + c] / denom;
        }
    }
    out
}

#[test]
fn forward_matches_naive() {
    for (irreps, lsh, lout) in [
        ("3x0e+2x1e+2x2e", 2, 2),
        ("2x0e+1x1e+2x2e+1x3e", 3, 3),
        ("4x0e", 2, 2),
        ("2x0e+2x1e+1x2e", 2, 0),
    ] {
        let s = setup(irreps, lsh, lout);
        let graph = ConvGraph::new(s.n, &s.centers, &s.neighbors).unwrap();
        let denom = 3.7;
        let mut out = vec![f64::NAN; s.n * s.paths.dim_msg()];
        conv_forward(&s.paths, &graph, &s.h, &s.sh, &s.w, denom, &mut out).unwrap();
        let want = naive(&s, &s.h, &s.sh, &s.w, denom);
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(scale > 0.1);
        for (a, b) in out.iter().zip(&want) {
            assert!(
                (a - b).abs() < 1e-13 * scale.max(1.0),
                "{irreps}: {a} vs {b}"
            );
        }
        // The row no edge points to is exactly zero.
        let dm = s.paths.dim_msg();
        assert!(out[6 * dm..7 * dm].iter().all(|v| *v == 0.0));
    }
}

#[test]
fn backward_matches_finite_differences() {
    for (irreps, lsh, lout) in [("3x0e+2x1e+2x2e", 2, 2), ("1x0e+1x1e+1x2e+1x3e", 3, 3)] {
        let s = setup(irreps, lsh, lout);
        let graph = ConvGraph::new(s.n, &s.centers, &s.neighbors).unwrap();
        let denom = 2.3;
        let dm = s.paths.dim_msg();
        let mut rng = Rng(7);
        let g = rng.vec(s.n * dm);
        let loss = |h: &[f64], sh: &[f64], w: &[f64]| -> f64 {
            naive(&s, h, sh, w, denom)
                .iter()
                .zip(&g)
                .map(|(a, b)| a * b)
                .sum()
        };
        let mut gh = vec![f64::NAN; s.h.len()];
        let mut gsh = vec![f64::NAN; s.sh.len()];
        let mut gw = vec![f64::NAN; s.w.len()];
        conv_backward(
            &s.paths, &graph, &s.h, &s.sh, &s.w, denom, &g, &mut gh, &mut gsh, &mut gw,
        )
        .unwrap();
        let eps = 1e-6;
        let fd = |which: usize, k: usize| -> f64 {
            let (mut h, mut sh, mut w) = (s.h.clone(), s.sh.clone(), s.w.clone());
            let arr = match which {
                0 => &mut h,
                1 => &mut sh,
                _ => &mut w,
            };
            arr[k] += eps;
            let p = loss(&h, &sh, &w);
            let arr = match which {
                0 => &mut h,
                1 => &mut sh,
                _ => &mut w,
            };
            arr[k] -= 2.0 * eps;
            (p - loss(&h, &sh, &w)) / (2.0 * eps)
        };
        for (which, grad) in [(0, &gh), (1, &gsh), (2, &gw)] {
            let mut max_abs = 0.0f64;
            for (k, &g) in grad.iter().enumerate() {
                let f = fd(which, k);
                max_abs = max_abs.max(f.abs());
                assert!(
                    (f - g).abs() < 1e-7,
                    "{irreps} input {which} index {k}: fd {f} vs {}",
                    g
                );
            }
            assert!(max_abs > 1e-3, "gradient {which} trivially zero");
        }
    }
}

#[test]
fn parallel_result_is_deterministic_and_f32_close() {
    let s = setup("3x0e+2x1e+2x2e", 2, 2);
    let graph = ConvGraph::new(s.n, &s.centers, &s.neighbors).unwrap();
    let mut a = vec![0.0; s.n * s.paths.dim_msg()];
    conv_forward(&s.paths, &graph, &s.h, &s.sh, &s.w, 1.5, &mut a).unwrap();
    let mut b = vec![0.0; a.len()];
    conv_forward(&s.paths, &graph, &s.h, &s.sh, &s.w, 1.5, &mut b).unwrap();
    assert_eq!(a, b);
    // Same paths in f32.
    let ir = Irreps::parse("3x0e+2x1e+2x2e").unwrap();
    let mut rng = Rng(42);
    let (p32, _, _) = ConvPaths::<f32>::uvu_sorted(
        &ir,
        2,
        |_| 1,
        |ir| ir.l <= 2,
        |x, y, z| {
            let sc = 0.5 + rng.next().abs();
            Ok(wigner_3j(x, y, z)?.iter().map(|v| v * sc).collect())
        },
    )
    .unwrap();
    let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let mut c = vec![0.0f32; a.len()];
    conv_forward(&p32, &graph, &f(&s.h), &f(&s.sh), &f(&s.w), 1.5, &mut c).unwrap();
    for (x, y) in a.iter().zip(&c) {
        assert!((x - *y as f64).abs() < 1e-5);
    }
}

#[test]
fn bad_inputs_are_errors() {
    assert!(ConvGraph::new(3, &[0, 3], &[1, 1]).is_err());
    assert!(ConvGraph::new(3, &[0, 1], &[1]).is_err());
    let s = setup("3x0e+2x1e+2x2e", 2, 2);
    let graph = ConvGraph::new(s.n, &s.centers, &s.neighbors).unwrap();
    let mut out = vec![0.0; s.n * s.paths.dim_msg()];
    assert!(conv_forward(&s.paths, &graph, &s.h[1..], &s.sh, &s.w, 1.0, &mut out).is_err());
    assert!(conv_forward(&s.paths, &graph, &s.h, &s.sh, &s.w, 0.0, &mut out).is_err());
}

/// The fused radial-MLP + convolution kernels against the unfused path
/// (`RadialMlp::forward` for all edges, then `conv_forward`; backward via
/// `conv_backward` and `RadialMlp::backward`), on a graph large enough to span
/// many edge blocks, with a hub row of more than one block's worth of edges
/// and rows that receive or send nothing.
#[test]
fn fused_radial_conv_matches_unfused() {
    let ir = Irreps::parse("4x0e+3x1e+2x2e+1x3e").unwrap();
    let (paths, _, _) =
        ConvPaths::<f64>::uvu_sorted(&ir, 3, |_| 1, |ir| ir.l <= 3, wigner_3j).unwrap();
    fused_matches_unfused(&ir, &paths);
}

/// The same with weight columns that no path reads (two after each path's
/// weights): their gradient is zero, so the MLP's input gradient must not
/// see whatever an earlier block left in the scratch there.
#[test]
fn fused_radial_conv_matches_unfused_with_unread_weights() {
    let ir = Irreps::parse("4x0e+3x1e+2x2e+1x3e").unwrap();
    let (mut tp, msg, _) = uvu_sorted_paths(&ir, 3, |_| 1, |ir| ir.l <= 3, wigner_3j).unwrap();
    let mut w_off = 0;
    for p in &mut tp {
        p.weight_offset = w_off;
        w_off += p.mul + 2;
    }
    let paths = ConvPaths::<f64>::new(ir.dim(), 3, w_off, msg.dim(), tp).unwrap();
    fused_matches_unfused(&ir, &paths);
}

/// Paths that share weight columns are refused: each path writes its
/// weights' whole gradient.
#[test]
fn paths_sharing_weight_columns_are_refused() {
    let ir = Irreps::parse("4x0e+3x1e").unwrap();
    let (mut tp, msg, _) = uvu_sorted_paths(&ir, 1, |_| 1, |_| true, wigner_3j).unwrap();
    let dim_w: usize = tp.iter().map(|p| p.mul).sum();
    assert!(ConvPaths::<f64>::new(ir.dim(), 1, dim_w, msg.dim(), tp.clone()).is_ok());
    tp[1].weight_offset = tp[0].weight_offset + 1;
    let err = ConvPaths::<f64>::new(ir.dim(), 1, dim_w, msg.dim(), tp).unwrap_err();
    assert!(err.to_string().contains("share weight columns"), "{err}");
}

/// The fused convolution fed by a radial table (edge lengths in, the
/// lengths' gradient out) equals the unfused convolution on the weights the
/// table gives, with the weights' gradient pulled back by the table's own
/// backward.
#[test]
fn fused_radial_conv_with_a_table_matches_unfused() {
    let ir = Irreps::parse("4x0e+3x1e+2x2e+1x3e").unwrap();
    let (paths, _, _) =
        ConvPaths::<f64>::uvu_sorted(&ir, 3, |_| 1, |ir| ir.l <= 3, wigner_3j).unwrap();
    let mut rng = Rng(5);
    let (n, ne, nb) = (120usize, 1500usize, 8usize);
    let centers: Vec<u32> = (0..ne).map(|_| rng.below(n)).collect();
    let neighbors: Vec<u32> = (0..ne).map(|_| rng.below(n)).collect();
    let graph = ConvGraph::new(n, &centers, &neighbors).unwrap();
    let emb = EdgeEmbedding {
        freqs: (1..=nb)
            .map(|k| k as f64 * std::f64::consts::PI / 5.0)
            .collect(),
        cutoff: 5.0,
        envelope: CutoffFunction::Polynomial { p: 6 },
    };
    let widths = [nb, 16, paths.dim_w()];
    let mats: Vec<Vec<f64>> = (0..2).map(|k| rng.vec(widths[k] * widths[k + 1])).collect();
    let radial = RadialMlp::<f64>::new(&widths, &mats).unwrap();
    let tol = TableTolerance {
        value: 1e-10,
        derivative: 1e-9,
    };
    let table = RadialTable::build(&emb, &radial, tol).unwrap();
    let vecs: Vec<[f64; 3]> = (0..ne)
        .map(|_| [rng.next() * 2.8, rng.next() * 2.8, rng.next() * 2.8])
        .collect();
    // Each length as its two columns (hi, lo = 0 in f64).
    let r: Vec<f64> = vecs
        .iter()
        .flat_map(|v| split_length::<f64>((v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt()))
        .collect();
    let mut sh = vec![0.0; ne * sh_dim(3)];
    sh_forward(&vecs, 3, &mut sh).unwrap();
    let h = rng.vec(n * ir.dim());
    let (denom, dm) = (3.1, paths.dim_msg());
    let mut w = vec![0.0; ne * paths.dim_w()];
    table.forward(&r, &mut w).unwrap();
    let g = rng.vec(n * dm);
    let [want, gh0, gsh0, gw0] = unfused(&paths, &graph, &h, &sh, &w, denom, &g);
    let mut gr0 = vec![0.0; 2 * ne];
    table.backward(&r, &gw0, &mut gr0).unwrap();

    let [mut out, gh, gr, gsh] = fused(&paths, &table, denom, &graph, &h, &r, &sh, &g);
    fused_equals_unfused(&[
        ("out", &out, &want),
        ("grad_h", &gh, &gh0),
        ("grad_r", &gr, &gr0),
        ("grad_sh", &gsh, &gsh0),
    ]);
    // A table is read with one input column per edge: the embedding's
    // eight are refused.
    let emb_rows = rng.vec(ne * nb);
    assert!(
        radial_conv_forward(&paths, &table, denom, &graph, &h, &emb_rows, &sh, &mut out).is_err()
    );
}

/// The unfused convolution on per-edge weights `w`, the reference of the
/// fused one: `[message, grad_h, grad_sh, grad_w]` from the message
/// gradient `g`.
fn unfused(
    paths: &ConvPaths<f64>,
    graph: &ConvGraph,
    h: &[f64],
    sh: &[f64],
    w: &[f64],
    denom: f64,
    g: &[f64],
) -> [Vec<f64>; 4] {
    let mut out = vec![0.0; graph.n_rows() * paths.dim_msg()];
    conv_forward(paths, graph, h, sh, w, denom, &mut out).unwrap();
    let (mut gh, mut gsh, mut gw) = (vec![0.0; h.len()], vec![0.0; sh.len()], vec![0.0; w.len()]);
    conv_backward(paths, graph, h, sh, w, denom, g, &mut gh, &mut gsh, &mut gw).unwrap();
    [out, gh, gsh, gw]
}

/// The fused convolution's message and its gradients `[message, grad_h,
/// grad_x, grad_sh]` from the message gradient `g`; `x` is what `radial`
/// reads. The buffers start as NaN: every element must be written.
#[allow(clippy::too_many_arguments)]
fn fused<'r>(
    paths: &ConvPaths<f64>,
    radial: impl Into<EdgeRadial<'r, f64>>,
    denom: f64,
    graph: &ConvGraph,
    h: &[f64],
    x: &[f64],
    sh: &[f64],
    g: &[f64],
) -> [Vec<f64>; 4] {
    let radial = radial.into();
    let mut out = vec![f64::NAN; graph.n_rows() * paths.dim_msg()];
    radial_conv_forward(paths, radial, denom, graph, h, x, sh, &mut out).unwrap();
    let (mut gh, mut gx, mut gsh) = (
        vec![f64::NAN; h.len()],
        vec![f64::NAN; x.len()],
        vec![f64::NAN; sh.len()],
    );
    radial_conv_backward(
        paths, radial, denom, graph, h, x, sh, g, &mut gh, &mut gx, &mut gsh,
    )
    .unwrap();
    [out, gh, gx, gsh]
}

/// Each named fused result within 1e-12 (relative to the largest value) of
/// its unfused reference, which must not be trivially zero.
fn fused_equals_unfused(cases: &[(&str, &Vec<f64>, &Vec<f64>)]) {
    for &(name, got, want) in cases {
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(scale > 1e-3, "{name} trivially zero");
        for (k, (a, b)) in got.iter().zip(want.iter()).enumerate() {
            assert!(
                (a - b).abs() <= 1e-12 * scale.max(1.0),
                "{name}[{k}]: fused {a} vs unfused {b}"
            );
        }
    }
}

fn fused_matches_unfused(ir: &Irreps, paths: &ConvPaths<f64>) {
    let paths = paths.clone();
    let mut rng = Rng(11);
    let (n, ne, nb) = (150usize, 2000usize, 8usize);
    let mut centers = Vec::new();
    let mut neighbors = Vec::new();
    for e in 0..ne {
        // Rows 140.. never receive, rows 0..5 never send; row 70 is a hub.
        let c = if e % 5 == 0 { 70 } else { rng.below(140) };
        centers.push(c);
        neighbors.push(5 + rng.below(145));
    }
    let graph = ConvGraph::new(n, &centers, &neighbors).unwrap();
    let widths = [nb, 16, 12, paths.dim_w()];
    let mats: Vec<Vec<f64>> = (0..3).map(|k| rng.vec(widths[k] * widths[k + 1])).collect();
    let radial = RadialMlp::<f64>::new(&widths, &mats).unwrap();
    let vecs: Vec<[f64; 3]> = (0..ne)
        .map(|_| [rng.next() * 3.0, rng.next() * 3.0, rng.next() * 3.0])
        .collect();
    let mut sh = vec![0.0; ne * sh_dim(3)];
    sh_forward(&vecs, 3, &mut sh).unwrap();
    let h = rng.vec(n * ir.dim());
    let emb = rng.vec(ne * nb);
    let denom = 2.9;
    let dm = paths.dim_msg();

    // Unfused reference.
    let mut w = vec![0.0; ne * paths.dim_w()];
    radial.forward(&emb, ne, &mut w).unwrap();
    let g = rng.vec(n * dm);
    let [want, gh0, gsh0, gw0] = unfused(&paths, &graph, &h, &sh, &w, denom, &g);
    let mut gemb0 = vec![0.0; emb.len()];
    radial.backward(&emb, ne, &gw0, &mut gemb0).unwrap();

    // Fused.
    let [mut out, gh, gemb, gsh] = fused(&paths, &radial, denom, &graph, &h, &emb, &sh, &g);
    fused_equals_unfused(&[
        ("out", &out, &want),
        ("grad_h", &gh, &gh0),
        ("grad_emb", &gemb, &gemb0),
        ("grad_sh", &gsh, &gsh0),
    ]);
    // Rows that receive nothing have a zero output; rows that send nothing a zero gradient.
    assert!(out[140 * dm..].iter().all(|v| *v == 0.0));
    assert!(gh[..5 * ir.dim()].iter().all(|v| *v == 0.0));

    // Same result on a repeat (blocks are fixed by the graph, not the scheduler).
    let mut again = vec![0.0; n * dm];
    radial_conv_forward(&paths, &radial, denom, &graph, &h, &emb, &sh, &mut again).unwrap();
    assert_eq!(out, again);

    // Mismatched MLP output width and bad lengths are errors.
    let small = RadialMlp::<f64>::new(&[nb, 3], &[rng.vec(nb * 3)]).unwrap();
    assert!(radial_conv_forward(&paths, &small, denom, &graph, &h, &emb, &sh, &mut out).is_err());
    assert!(
        radial_conv_forward(&paths, &radial, denom, &graph, &h, &emb[1..], &sh, &mut out).is_err()
    );
}

/// The paths `uvu_sorted` builds tile the message irreps it returns, and
/// that irreps with neighbouring equal blocks merged (as a model's Linear
/// may read it), so the Linear can read the convolution's component-major
/// message; irreps of the same width cut otherwise are told apart.
#[test]
fn uvu_paths_tile_their_message_irreps() {
    let ir = Irreps::parse("128x0e+64x1e+32x2e").unwrap();
    let parity = |l: usize| if l.is_multiple_of(2) { 1 } else { -1 };
    let (paths, msg, _) =
        ConvPaths::<f64>::uvu_sorted(&ir, 2, parity, |ir| ir.l <= 2, wigner_3j).unwrap();
    assert_eq!(msg.dim(), 3136, "SevenNet-0's message width");
    assert!(paths.tiles_blocks_of(&msg));
    let mut merged: Vec<(usize, ddmlip_e3nn::Irrep)> = Vec::new();
    for b in &msg.blocks {
        match merged.last_mut() {
            Some((m, irrep)) if *irrep == b.ir => *m += b.mul,
            _ => merged.push((b.mul, b.ir)),
        }
    }
    assert!(merged.len() < msg.blocks.len(), "some blocks merge");
    let merged = Irreps::parse(
        &merged
            .iter()
            .map(|(m, irrep)| format!("{m}x{}{}", irrep.l, if irrep.p > 0 { 'e' } else { 'o' }))
            .collect::<Vec<_>>()
            .join("+"),
    )
    .unwrap();
    assert_eq!(merged.dim(), msg.dim());
    assert!(paths.tiles_blocks_of(&merged));
    assert!(!paths.tiles_blocks_of(&ir));
    let scalars = Irreps::parse(&format!("{}x0e", msg.dim())).unwrap();
    assert!(!paths.tiles_blocks_of(&scalars));
}
