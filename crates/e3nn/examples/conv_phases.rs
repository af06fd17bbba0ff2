//! Times the pieces of SevenNet-0's interaction (radial MLP, fused
//! convolution forward and backward) on random data of SevenNet-0's shapes:
//! 128x0e+64x1e+32x2e features, spherical harmonics to l = 2, radial MLP
//! 8→64→64→960, a random graph of 28 edges per atom.
//!
//! Usage: `RAYON_NUM_THREADS=1 cargo run --release -p ddmlip-e3nn --example conv_phases -- [ATOMS [REPS]]`.
//! Prints the least CPU time of REPS calls of each piece (the least
//! disturbed by other work on a shared machine) in core·µs per atom, for
//! f32 and f64.

use ddmlip_e3nn::{
    nsilu, radial_conv_backward, radial_conv_forward, sh_dim, sh_forward, wigner_3j, ConvGraph,
    ConvPaths, Irreps, RadialMlp, Real,
};

/// A fixed-seed LCG in [-1, 1).
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
}

/// CPU seconds this process has used (all threads).
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The least CPU time of `reps` runs of `f` (after one warm-up), in seconds.
fn fastest(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = cpu_seconds();
            f();
            cpu_seconds() - t
        })
        .fold(f64::INFINITY, f64::min)
}

fn run<T: Real>(n: usize, reps: usize) {
    let ir = Irreps::parse("128x0e+64x1e+32x2e").expect("irreps");
    let (paths, _, _) =
        ConvPaths::<T>::uvu_sorted(&ir, 2, |_| 1, |ir| ir.l <= 2, wigner_3j).expect("paths");
    let mut rng = Rng(7);
    let ne = n * 28;
    let centers: Vec<u32> = (0..ne).map(|e| (e / 28) as u32).collect();
    let neighbors: Vec<u32> = (0..ne)
        .map(|_| (((rng.next() + 1.0) / 2.0 * n as f64) as usize).min(n - 1) as u32)
        .collect();
    let graph = ConvGraph::new(n, &centers, &neighbors).expect("graph");
    let widths = [8, 64, 64, paths.dim_w()];
    let mats: Vec<Vec<f64>> = (0..3).map(|k| rng.vec(widths[k] * widths[k + 1])).collect();
    let radial = RadialMlp::<T>::new(&widths, &mats).expect("mlp");
    let vecs: Vec<[f64; 3]> = (0..ne)
        .map(|_| [rng.next() * 3.0, rng.next() * 3.0, rng.next() * 3.0])
        .collect();
    let mut sh64 = vec![0.0; ne * sh_dim(2)];
    sh_forward(&vecs, 2, &mut sh64).expect("sh");
    let cast = |v: Vec<f64>| -> Vec<T> { v.into_iter().map(T::from_f64).collect() };
    let sh = cast(sh64);
    let h = cast(rng.vec(n * ir.dim()));
    let emb = cast(rng.vec(ne * 8));
    let ga = cast(rng.vec(n * paths.dim_msg()));
    let mut out = vec![T::ZERO; n * paths.dim_msg()];
    let (mut gh, mut gemb, mut gsh) = (
        vec![T::ZERO; h.len()],
        vec![T::ZERO; emb.len()],
        vec![T::ZERO; sh.len()],
    );
    let mut w = vec![T::ZERO; ne * paths.dim_w()];
    let mut gemb2 = vec![T::ZERO; emb.len()];
    let mlp_f = fastest(reps, || radial.forward(&emb, ne, &mut w).expect("mlp"));
    let mlp_b = fastest(reps, || {
        radial
            .backward(&emb, ne, &w, &mut gemb2)
            .expect("mlp backward")
    });
    let fwd = fastest(reps, || {
        radial_conv_forward(&paths, &radial, 1.0, &graph, &h, &emb, &sh, &mut out).expect("fwd")
    });
    let bwd = fastest(reps, || {
        radial_conv_backward(
            &paths, &radial, 1.0, &graph, &h, &emb, &sh, &ga, &mut gh, &mut gemb, &mut gsh,
        )
        .expect("bwd")
    });
    let x: Vec<T> = cast(rng.vec(1 << 20))
        .into_iter()
        .map(|v| v * T::from_f64(8.0))
        .collect();
    let mut y = vec![T::ZERO; x.len()];
    let silu = fastest(reps, || {
        for (o, &v) in y.iter_mut().zip(std::hint::black_box(&x)) {
            *o = nsilu(v);
        }
        std::hint::black_box(&mut y);
    });
    let us = |s: f64| s * 1e6 / n as f64;
    println!(
        "{}: {n} atoms, {ne} edges | MLP forward {:.1}, MLP backward (with its forward) {:.1}, \
         conv forward (with MLP) {:.1}, conv backward (with MLP) {:.1} core·µs/atom | SiLU {:.2} ns/element",
        std::any::type_name::<T>(),
        us(mlp_f),
        us(mlp_b),
        us(fwd),
        us(bwd),
        silu * 1e9 / x.len() as f64
    );
}

fn main() {
    let arg = |k: usize, d: usize| {
        std::env::args()
            .nth(k)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (n, reps) = (arg(1, 500), arg(2, 5));
    run::<f32>(n, reps);
    run::<f64>(n, reps);
}
