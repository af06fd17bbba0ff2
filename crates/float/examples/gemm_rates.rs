//! GEMM rates (GFLOP/s) of the candidate kernels on the shapes SevenNet-0
//! runs, f32 and f64, on 1 and 2 threads: matrixmultiply, the gemm crate
//! (faer's kernels, AVX-512 with its x86-v4 feature) called directly, and
//! `ddmlip_float::gemm` (the engine's GEMM, behind its checked views);
//! `ratio` is the gemm crate over matrixmultiply.
//!
//! The shapes are the ones the e3nn kernels call: the radial MLP on blocks
//! of 256 edges (`8→64→64→W`, W = 384, 960 or 224, and the backward's
//! products with the transposed weights) and the irreps linears on blocks of
//! 64 atoms (one product per component of an l block, so A and C are read
//! with a column stride of 2l+1). Each shape runs as the code runs it: many
//! rows cut into blocks of the block height, one single-threaded GEMM per
//! block, the blocks spread over a rayon pool of 1 or 2 threads. Kernels are
//! timed alternately (A B A B …) and the median of the rounds is printed,
//! so a machine shared with other work biases neither. The rate is per
//! second of the process's CPU time (all its threads), i.e. GFLOP per
//! core-second: on a machine time-sliced with other work, wall time counts
//! the slices other processes ran; the wall rate is printed beside it.
//!
//! `cargo run --release -p ddmlip-float --example gemm_rates [ROUNDS]`

use ddmlip_float::Real;
use rayon::prelude::*;
use std::time::Instant;

/// One product shape: `C (m×n) = A (m×k) · B (k×n)` per block.
struct Shape {
    name: &'static str,
    /// Rows per block (the GEMM's m).
    m: usize,
    k: usize,
    n: usize,
    /// B stored transposed (n×k row-major), as the MLP backward reads it.
    b_transposed: bool,
    /// Column stride of A and C (2l+1 for an irreps block of degree l).
    comp: usize,
}

/// Rows of the edge-shaped products (a few thousand atoms' edges).
const TOTAL_EDGE_ROWS: usize = 16384;
/// Rows of the atom-shaped products.
const TOTAL_ATOM_ROWS: usize = 4096;

fn shapes() -> Vec<Shape> {
    let s = |name, m, k, n, b_transposed, comp| Shape {
        name,
        m,
        k,
        n,
        b_transposed,
        comp,
    };
    vec![
        s("mlp fwd 8→64", 256, 8, 64, false, 1),
        s("mlp fwd 64→64", 256, 64, 64, false, 1),
        s("mlp fwd 64→384", 256, 64, 384, false, 1),
        s("mlp fwd 64→960", 256, 64, 960, false, 1),
        s("mlp bwd 960→64 Bᵀ", 256, 960, 64, true, 1),
        s("mlp bwd 64→64 Bᵀ", 256, 64, 64, true, 1),
        s("linear 0e 128→128", 64, 128, 128, false, 1),
        s("linear 0e 224→224", 64, 224, 224, false, 1),
        s("linear 1e 64→64 /3", 64, 64, 64, false, 3),
        s("linear 2e 32→32 /5", 64, 32, 32, false, 5),
        s("linear 1e 384→64 /3", 64, 384, 64, false, 3),
        s("mlp fwd 64→960 tall", 4096, 64, 960, false, 1),
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    MatrixMultiply,
    /// The gemm crate called directly.
    Gemm,
    /// `ddmlip_float::gemm`, the engine's GEMM (its checks included).
    Checked,
}

/// One block's product, component `comp_index` of every row: the slices
/// hold the block's A rows (m × k·comp), B (k × n) and the C rows (m × n·comp).
fn block<T: Real>(
    kernel: Kernel,
    s: &Shape,
    m: usize,
    (a, b, c): (&[T], &[T], &mut [T]),
    comp_index: usize,
) {
    let (k, n, d) = (s.k, s.n, s.comp);
    assert!(comp_index < d && a.len() >= m * k * d && c.len() >= m * n * d && b.len() >= k * n);
    let (rsa, csa) = ((k * d) as isize, d as isize);
    let (rsc, csc) = ((n * d) as isize, d as isize);
    let (rsb, csb) = if s.b_transposed {
        (1, k as isize)
    } else {
        (n as isize, 1)
    };
    if kernel == Kernel::Checked {
        ddmlip_float::gemm(
            m,
            k,
            n,
            T::ONE,
            &a[comp_index..],
            rsa,
            csa,
            b,
            rsb,
            csb,
            T::ZERO,
            &mut c[comp_index..],
            rsc,
            csc,
        );
        return;
    }
    let (ap, cp) = (a[comp_index..].as_ptr(), c[comp_index..].as_mut_ptr());
    // SAFETY: the assert above keeps the strided m×k, k×n and m×n views
    // inside `a`, `b` and `c`; `c` is a unique borrow.
    unsafe {
        match kernel {
            // `Real::gemm_raw` is matrixmultiply's sgemm/dgemm, unchecked.
            Kernel::MatrixMultiply => T::gemm_raw(
                m,
                k,
                n,
                T::ONE,
                ap,
                rsa,
                csa,
                b.as_ptr(),
                rsb,
                csb,
                T::ZERO,
                cp,
                rsc,
                csc,
            ),
            Kernel::Gemm => gemm::gemm(
                m,
                n,
                k,
                cp,
                csc,
                rsc,
                false,
                ap,
                csa,
                rsa,
                b.as_ptr(),
                csb,
                rsb,
                T::ZERO,
                T::ONE,
                false,
                false,
                false,
                gemm::Parallelism::None,
            ),
            Kernel::Checked => unreachable!("handled above"),
        }
    }
}

/// CPU time of this process, all threads (seconds).
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

/// (CPU seconds, wall seconds) of one pass over all rows of `s` on the
/// current rayon pool.
fn pass<T: Real>(kernel: Kernel, s: &Shape, a: &[T], b: &[T], c: &mut [T]) -> (f64, f64) {
    let (ka, nc) = (s.k * s.comp, s.n * s.comp);
    let (c0, t0) = (cpu_seconds(), Instant::now());
    c.par_chunks_mut(s.m * nc)
        .zip(a.par_chunks(s.m * ka))
        .for_each(|(cb, ab)| {
            let m = ab.len() / ka;
            for comp in 0..s.comp {
                block(kernel, s, m, (ab, b, &mut *cb), comp);
            }
        });
    (cpu_seconds() - c0, t0.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn run<T: Real>(label: &str, rounds: usize) {
    let kernels = [Kernel::MatrixMultiply, Kernel::Gemm, Kernel::Checked];
    for threads in [1, 2] {
        let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(threads).build() else {
            eprintln!("no rayon pool of {threads} threads");
            return;
        };
        println!(
            "\n{label}, {threads} thread(s): GFLOP per CPU-second (wall GFLOP/s), \
             median of {rounds} alternating rounds"
        );
        println!(
            "| {:<36} | {:>6} | {:>16} | {:>16} | {:>16} | {:>5} |",
            "shape (block m×k×n)", "blocks", "matrixmultiply", "gemm", "ddmlip_float", "ratio"
        );
        for s in shapes() {
            let total = if s.m == 64 {
                TOTAL_ATOM_ROWS
            } else {
                TOTAL_EDGE_ROWS
            };
            let mut seed = 0x9e37_79b9_u64;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                T::from_f64((seed % 2000) as f64 / 1000.0 - 1.0)
            };
            let a: Vec<T> = (0..total * s.k * s.comp).map(|_| next()).collect();
            let b: Vec<T> = (0..s.k * s.n).map(|_| next()).collect();
            let mut c = vec![T::default(); total * s.n * s.comp];
            let flops = 2.0 * (total * s.k * s.n * s.comp) as f64;
            let mut cpu = [Vec::new(), Vec::new(), Vec::new()];
            let mut wall = [Vec::new(), Vec::new(), Vec::new()];
            pool.install(|| {
                for round in 0..=rounds {
                    for (i, &kern) in kernels.iter().enumerate() {
                        let (tc, tw) = pass(kern, &s, &a, &b, &mut c);
                        if round > 0 {
                            cpu[i].push(tc);
                            wall[i].push(tw);
                        }
                    }
                }
            });
            let [mm, ge, ch] = cpu.map(|t| flops / median(t) / 1e9);
            let [mm_w, ge_w, ch_w] = wall.map(|t| flops / median(t) / 1e9);
            println!(
                "| {:<36} | {:>6} | {:>16} | {:>16} | {:>16} | {:>5.2} |",
                format!("{} ({}×{}×{})", s.name, s.m, s.k, s.n),
                total / s.m,
                format!("{mm:.1} ({mm_w:.1})"),
                format!("{ge:.1} ({ge_w:.1})"),
                format!("{ch:.1} ({ch_w:.1})"),
                ge / mm
            );
        }
    }
}

fn main() {
    let rounds = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(15);
    // matrixmultiply reads this at its first call: one thread per call, as
    // the engine's row blocks run. Set before any other thread exists.
    std::env::set_var("MATMUL_NUM_THREADS", "1");
    run::<f32>("f32", rounds);
    run::<f64>("f64", rounds);
}
