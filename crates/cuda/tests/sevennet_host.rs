//! The host side of SevenNet on the GPU, without a GPU: the dense matrices
//! read off the irreps linears, the path tables and gate tables (run here by
//! a plain-Rust copy of the kernels' loops, against `ddmlip-e3nn`'s CPU
//! kernels on a random graph), the row chunks and the memory estimate.

use ddmlip_cuda::sevennet::{
    row_chunks, ConvTables, GateTables, HostModel, PATH_FIELDS, RANGE_FIELDS,
};
use ddmlip_e3nn::conv::{radial_conv_backward, radial_conv_forward, ConvGraph};
use ddmlip_e3nn::sevennet::{SevenNet, SevenNetWeights};
use ddmlip_e3nn::{nsilu, Activation, Gate};
use ddmlip_testkit::SplitMix64;
use std::sync::OnceLock;

fn weights() -> &'static SevenNetWeights {
    static W: OnceLock<SevenNetWeights> = OnceLock::new();
    W.get_or_init(|| {
        SevenNetWeights::from_checkpoint(ddmlip_testkit::sevennet_checkpoint())
            .expect("read the SevenNet-0 checkpoint")
    })
}

fn random(rng: &mut SplitMix64, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.uniform()).collect()
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
fn dense_matrices_reproduce_every_linear_of_sevennet_0() {
    let host = HostModel::new(weights(), None).unwrap();
    let net = SevenNet::<f64>::new(weights()).unwrap();
    let mut rng = SplitMix64::new(5);
    let rows = 7;
    for (l, (hl, block)) in host.layers.iter().zip(&net.blocks).enumerate() {
        let x = random(&mut rng, rows * block.dim_in());
        let mut want = vec![0.0; rows * block.dim_in()];
        block.linear_1.forward(&x, rows, &mut want).unwrap();
        let got = hl.linear_1.apply(&x, rows);
        assert!(max_rel(&got, &want) < 1e-13, "layer {l} linear_1");
        let dm = block.conv.dim_msg();
        let a = random(&mut rng, rows * dm);
        let mut want = vec![0.0; rows * block.gate.dim_in()];
        block.linear_2.forward(&a, rows, &mut want).unwrap();
        assert!(
            max_rel(&hl.linear_2.apply(&a, rows), &want) < 1e-13,
            "layer {l} linear_2"
        );
        let types = vec![0usize; rows];
        block
            .self_connection
            .forward(&x, &types, &mut want)
            .unwrap();
        assert!(
            max_rel(&hl.self_connection.apply(&x, rows), &want) < 1e-13,
            "layer {l} self-connection"
        );
    }
    // Readout: scaled energies of random last-layer features.
    let d = host.readout.dim_in;
    let x = random(&mut rng, rows * d);
    let types: Vec<usize> = (0..rows).map(|i| 10 * i).collect();
    let want = net.readout(&x, &types).unwrap();
    let e = host.readout.apply(&x, rows);
    for (i, &t) in types.iter().enumerate() {
        let got = host.scale[t] * e[i] + host.shift[t];
        assert!(
            (got - want[i]).abs() < 1e-12 * want[i].abs().max(1.0),
            "readout row {i}"
        );
    }
    // SevenNet-0: 5 blocks, 128 scalars in, weights per edge as published.
    assert_eq!(host.layers.len(), 5);
    let dim_w: Vec<usize> = host.layers.iter().map(|l| l.conv.dim_w).collect();
    assert_eq!(dim_w, [384, 960, 960, 960, 224]);
}

/// A random graph of `n` rows with every row a receiver of a few edges.
fn random_graph(rng: &mut SplitMix64, n: usize) -> (Vec<u32>, Vec<u32>) {
    let (mut centers, mut neighbors) = (Vec::new(), Vec::new());
    for i in 0..n {
        let deg = 1 + (rng.next_u64() % 5) as usize;
        for _ in 0..deg {
            centers.push(i as u32);
            neighbors.push((rng.next_u64() % n as u64) as u32);
        }
    }
    (centers, neighbors)
}

fn mlp(widths: &[usize], mats: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
    let mut cur = x.to_vec();
    for (k, m) in mats.iter().enumerate() {
        let (i, o) = (widths[k], widths[k + 1]);
        let mut next = vec![0.0; o];
        for a in 0..i {
            for b in 0..o {
                next[b] += cur[a] * m[a * o + b];
            }
        }
        if k + 1 < mats.len() {
            next.iter_mut().for_each(|v| *v = nsilu(*v));
        }
        cur = next;
    }
    cur
}

/// The filter matrix of path `p` for SH row `y`, as `path_filter` computes it.
fn filter(t: &ConvTables, p: usize, y: &[f64]) -> Vec<f64> {
    let f = &t.paths[PATH_FIELDS * p..PATH_FIELDS * (p + 1)];
    let mut out = vec![0.0; (f[0] * f[1]) as usize];
    for z in f[6] as usize..f[7] as usize {
        out[t.nz_idx[2 * z] as usize] += t.nz_coef[z] * y[t.nz_idx[2 * z + 1] as usize];
    }
    out.iter().map(|v| v * t.inv_den).collect()
}

#[test]
fn path_tables_reproduce_the_cpu_convolution_forward_and_backward() {
    let host = HostModel::new(weights(), None).unwrap();
    let net = SevenNet::<f64>::new(weights()).unwrap();
    let mut rng = SplitMix64::new(9);
    let n = 6;
    let (centers, nbrs) = random_graph(&mut rng, n);
    let ne = centers.len();
    let graph = ConvGraph::new(n, &centers, &nbrs).unwrap();
    for layer in [0, 1, 4] {
        let (hl, block) = (&host.layers[layer], &net.blocks[layer]);
        let t = &hl.conv;
        let (nb, ds) = (hl.radial_widths[0], t.dim_sh);
        let h = random(&mut rng, n * t.dim_in);
        let emb = random(&mut rng, ne * nb);
        let sh = random(&mut rng, ne * ds);
        let mut want = vec![0.0; n * t.dim_msg];
        radial_conv_forward(
            &block.conv,
            &block.radial,
            1.0 / t.inv_den,
            &graph,
            &h,
            &emb,
            &sh,
            &mut want,
        )
        .unwrap();
        // The kernels' loops: a thread per (path, channel), edges in receiver order.
        let w: Vec<Vec<f64>> = (0..ne)
            .map(|e| mlp(&hl.radial_widths, &hl.radial, &emb[e * nb..(e + 1) * nb]))
            .collect();
        let mut got = vec![0.0; n * t.dim_msg];
        for col in 0..t.dim_w {
            let p = t.col_path[col] as usize;
            let f = &t.paths[PATH_FIELDS * p..PATH_FIELDS * (p + 1)];
            let (d1, d3, in_off, w_off, out_off) = (
                f[0] as usize,
                f[1] as usize,
                f[3] as usize,
                f[4] as usize,
                f[5] as usize,
            );
            let u = col - w_off;
            for e in 0..ne {
                let (i, j) = (centers[e] as usize, nbrs[e] as usize);
                let tm = filter(t, p, &sh[e * ds..(e + 1) * ds]);
                for k in 0..d3 {
                    for a in 0..d1 {
                        got[i * t.dim_msg + out_off + u * d3 + k] += tm[a * d3 + k]
                            * (w[e][w_off + u] * h[j * t.dim_in + in_off + u * d1 + a]);
                    }
                }
            }
        }
        assert!(
            max_rel(&got, &want) < 1e-12,
            "layer {layer} forward {}",
            max_rel(&got, &want)
        );

        // Backward: feature gradient by (input range, channel) and SH gradient.
        let ga = random(&mut rng, n * t.dim_msg);
        let (mut gh_want, mut gemb, mut gsh_want) = (
            vec![0.0; n * t.dim_in],
            vec![0.0; ne * nb],
            vec![0.0; ne * ds],
        );
        radial_conv_backward(
            &block.conv,
            &block.radial,
            1.0 / t.inv_den,
            &graph,
            &h,
            &emb,
            &sh,
            &ga,
            &mut gh_want,
            &mut gemb,
            &mut gsh_want,
        )
        .unwrap();
        let mut gh = vec![0.0; n * t.dim_in];
        for r in 0..t.n_ranges() {
            let f = &t.ranges[RANGE_FIELDS * r..RANGE_FIELDS * (r + 1)];
            let (in_off, mul, d1, p0, np) = (
                f[0] as usize,
                f[1] as usize,
                f[2] as usize,
                f[4] as usize,
                f[5] as usize,
            );
            for u in 0..mul {
                for e in 0..ne {
                    let (i, j) = (centers[e] as usize, nbrs[e] as usize);
                    for &p in &t.range_paths[p0..p0 + np] {
                        let p = p as usize;
                        let pf = &t.paths[PATH_FIELDS * p..PATH_FIELDS * (p + 1)];
                        let (d3, w_off, out_off) = (pf[1] as usize, pf[4] as usize, pf[5] as usize);
                        let tm = filter(t, p, &sh[e * ds..(e + 1) * ds]);
                        for a in 0..d1 {
                            for k in 0..d3 {
                                gh[j * t.dim_in + in_off + u * d1 + a] += tm[a * d3 + k]
                                    * (w[e][w_off + u] * ga[i * t.dim_msg + out_off + u * d3 + k]);
                            }
                        }
                    }
                }
            }
        }
        assert!(
            max_rel(&gh, &gh_want) < 1e-12,
            "layer {layer} feature gradient"
        );
        let mut gsh = vec![0.0; ne * ds];
        for e in 0..ne {
            let (i, j) = (centers[e] as usize, nbrs[e] as usize);
            for p in 0..t.n_paths {
                let f = &t.paths[PATH_FIELDS * p..PATH_FIELDS * (p + 1)];
                let (d1, d3, mul, in_off, w_off, out_off) = (
                    f[0] as usize,
                    f[1] as usize,
                    f[2] as usize,
                    f[3] as usize,
                    f[4] as usize,
                    f[5] as usize,
                );
                let mut gt = vec![0.0; d1 * d3];
                for u in 0..mul {
                    for a in 0..d1 {
                        for k in 0..d3 {
                            gt[a * d3 + k] += w[e][w_off + u]
                                * h[j * t.dim_in + in_off + u * d1 + a]
                                * ga[i * t.dim_msg + out_off + u * d3 + k];
                        }
                    }
                }
                for z in f[6] as usize..f[7] as usize {
                    gsh[e * ds + t.nz_idx[2 * z + 1] as usize] +=
                        t.nz_coef[z] * gt[t.nz_idx[2 * z] as usize] * t.inv_den;
                }
            }
        }
        assert!(
            max_rel(&gsh, &gsh_want) < 1e-12,
            "layer {layer} SH gradient"
        );
    }
}

#[test]
fn gate_tables_reproduce_the_gate() {
    let gates = [
        Gate::silu(4, vec![(2, 1), (3, 2)]),
        Gate {
            n_scalars: 3,
            gated: vec![(1, 1), (2, 3)],
            scalar_activations: vec![(1, Activation::Tanh), (2, Activation::Silu)],
            gate_activation: Activation::Tanh,
        },
    ];
    let act = |code: i32, x: f64| match code {
        0 => Activation::Silu.eval(x),
        _ => Activation::Tanh.eval(x),
    };
    let grad = |code: i32, x: f64| match code {
        0 => Activation::Silu.grad(x),
        _ => Activation::Tanh.grad(x),
    };
    let mut rng = SplitMix64::new(3);
    for gate in &gates {
        let t = GateTables::new(gate).unwrap();
        let x = random(&mut rng, t.dim_in);
        let mut want = vec![0.0; t.dim_out];
        gate.forward(&x, 1, &mut want).unwrap();
        let got: Vec<f64> = (0..t.dim_out)
            .map(|o| {
                let r = &t.forward[4 * o..4 * o + 4];
                if r[0] == 0 {
                    act(r[3], x[r[1] as usize])
                } else {
                    act(t.gate_activation, x[r[2] as usize]) * x[r[1] as usize]
                }
            })
            .collect();
        assert!(max_rel(&got, &want) < 1e-15);
        let go = random(&mut rng, t.dim_out);
        let mut want = vec![0.0; t.dim_in];
        gate.backward(&x, &go, 1, &mut want).unwrap();
        let got: Vec<f64> = (0..t.dim_in)
            .map(|c| {
                let r = &t.backward[4 * c..4 * c + 4];
                match r[0] {
                    0 => go[r[1] as usize] * grad(r[3], x[c]),
                    1 => {
                        let dot: f64 = (0..r[3] as usize)
                            .map(|k| go[r[1] as usize + k] * x[r[2] as usize + k])
                            .sum();
                        dot * grad(t.gate_activation, x[c])
                    }
                    _ => go[r[1] as usize] * act(t.gate_activation, x[r[2] as usize]),
                }
            })
            .collect();
        assert!(max_rel(&got, &want) < 1e-14);
    }
    let relu = Gate {
        n_scalars: 1,
        gated: vec![],
        scalar_activations: vec![(1, Activation::Relu)],
        gate_activation: Activation::Silu,
    };
    let err = GateTables::new(&relu).unwrap_err().to_string();
    assert!(
        err.contains("relu") && err.contains("--device cpu"),
        "{err}"
    );
}

#[test]
fn row_chunks_tile_the_rows_within_the_cap() {
    let mut rng = SplitMix64::new(1);
    for cap in [1u64, 3, 10, 64] {
        let mut offsets = vec![0u64];
        for _ in 0..200 {
            let deg = rng.next_u64() % 12;
            offsets.push(offsets.last().unwrap() + deg);
        }
        let chunks = row_chunks(&offsets, cap);
        let mut next_row = 0;
        for &(r0, r1, p0, p1) in &chunks {
            assert_eq!(r0, next_row);
            assert!(r1 > r0);
            assert_eq!((p0, p1), (offsets[r0 as usize], offsets[r1 as usize]));
            // Over the cap only when a single row is longer than it.
            assert!(p1 - p0 <= cap || r1 == r0 + 1, "cap {cap}: {r0}..{r1}");
            next_row = r1;
        }
        assert_eq!(next_row as usize, offsets.len() - 1);
    }
    assert!(row_chunks(&[0], 4).is_empty());
}

#[test]
fn memory_estimate_fits_400k_atoms_of_silicon_in_f32_on_an_h200() {
    let host = HostModel::new(weights(), None).unwrap();
    // Bulk Si at SevenNet-0's 5 Å cutoff: 28 neighbours per atom (the
    // 64-atom fixture frame has 1792 edges).
    let (atoms, edges) = (400_000u64, 28 * 400_000u64);
    let f32_bytes = host.memory_bytes(atoms, edges, 4, 1 << 16);
    let per_atom = f32_bytes as f64 / atoms as f64 / 1024.0;
    eprintln!("SevenNet-0 f32 estimate: {per_atom:.1} KiB/atom at 28 edges/atom");
    assert!(per_atom <= 330.0, "{per_atom} KiB/atom");
    assert!(
        f32_bytes < 139 * (1u64 << 30),
        "400k atoms must fit an H200"
    );
    // f64 costs more, and more edges cost more.
    assert!(host.memory_bytes(atoms, edges, 8, 1 << 16) > f32_bytes);
    assert!(host.memory_bytes(atoms, 2 * edges, 4, 1 << 16) > f32_bytes);
}
