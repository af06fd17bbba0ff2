//! The GEMM kernel behind `gemm` on the shapes SevenNet-0 runs: each row of
//! C must not depend on how many rows one call holds (the engine and the
//! e3nn kernels cut products into row blocks whose height depends on the
//! thread count and the work sharing, and promise the same bits either
//! way), results must match an f64 triple loop, `beta = 0` must not read C,
//! and an empty inner dimension must give `beta·C`.

use ddmlip_float::{gemm, Real};

/// xorshift values in [-1, 1).
fn values<T: Real>(n: usize, mut seed: u64) -> Vec<T> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            T::from_f64((seed % 4096) as f64 / 2048.0 - 1.0)
        })
        .collect()
}

/// One product layout: C (m × n·comp) = A (m × k·comp) · B, one component
/// (column offset `c` of every 2l+1 group) at a time, as the irreps linears
/// call it; B is k×n, or stored n×k when `bt`, as the MLP backward reads it.
#[derive(Clone, Copy, Debug)]
struct Layout {
    k: usize,
    n: usize,
    comp: usize,
    bt: bool,
}

impl Layout {
    /// `C[rows] = A[rows]·B` for rows `r0..r1`, component `c`, in one call.
    fn run<T: Real>(&self, a: &[T], b: &[T], cm: &mut [T], (r0, r1): (usize, usize), c: usize) {
        let (k, n, d) = (self.k, self.n, self.comp);
        let (rsb, csb) = if self.bt { (1, k) } else { (n, 1) };
        gemm(
            r1 - r0,
            k,
            n,
            T::ONE,
            &a[r0 * k * d + c..],
            (k * d) as isize,
            d as isize,
            b,
            rsb as isize,
            csb as isize,
            T::ZERO,
            &mut cm[r0 * n * d + c..],
            (n * d) as isize,
            d as isize,
        );
    }

    fn b_at<T: Real>(&self, b: &[T], p: usize, j: usize) -> T {
        if self.bt {
            b[j * self.k + p]
        } else {
            b[p * self.n + j]
        }
    }
}

/// SevenNet-0's products (radial MLP on edge blocks, irreps linears on atom
/// blocks; see the `gemm_rates` example), and shapes GEMM kernels often take
/// special paths for (one column, a two-term sum, sums longer than a k block).
const LAYOUTS: [Layout; 14] = [
    Layout {
        k: 8,
        n: 64,
        comp: 1,
        bt: false,
    },
    Layout {
        k: 64,
        n: 64,
        comp: 1,
        bt: false,
    },
    Layout {
        k: 64,
        n: 960,
        comp: 1,
        bt: false,
    },
    Layout {
        k: 960,
        n: 64,
        comp: 1,
        bt: true,
    },
    Layout {
        k: 128,
        n: 128,
        comp: 1,
        bt: false,
    },
    Layout {
        k: 64,
        n: 64,
        comp: 3,
        bt: false,
    },
    Layout {
        k: 32,
        n: 32,
        comp: 5,
        bt: false,
    },
    Layout {
        k: 224,
        n: 224,
        comp: 1,
        bt: false,
    },
    Layout {
        k: 384,
        n: 64,
        comp: 3,
        bt: false,
    },
    Layout {
        k: 64,
        n: 384,
        comp: 1,
        bt: false,
    },
    // The readout (one output column), a two-term sum, a long one.
    Layout {
        k: 64,
        n: 1,
        comp: 1,
        bt: false,
    },
    Layout {
        k: 2,
        n: 64,
        comp: 1,
        bt: false,
    },
    Layout {
        k: 1100,
        n: 8,
        comp: 1,
        bt: true,
    },
    Layout {
        k: 1100,
        n: 3,
        comp: 1,
        bt: false,
    },
];

fn rows_do_not_depend_on_the_block_height<T: Real>() {
    const M: usize = 300;
    let mut bad = Vec::new();
    for (t, lay) in LAYOUTS.iter().enumerate() {
        let (k, n, d) = (lay.k, lay.n, lay.comp);
        let a = values::<T>(M * k * d, 11 + t as u64);
        let b = values::<T>(k * n, 101 + t as u64);
        let mut whole = vec![T::ZERO; M * n * d];
        for c in 0..d {
            lay.run(&a, &b, &mut whole, (0, M), c);
        }
        for height in [1, 2, 3, 5, 8, 15, 16, 17, 31, 48, 64, 100, 255, 256] {
            let mut pieces = vec![T::ZERO; M * n * d];
            let mut r0 = 0;
            while r0 < M {
                let r1 = (r0 + height).min(M);
                for c in 0..d {
                    lay.run(&a, &b, &mut pieces, (r0, r1), c);
                }
                r0 = r1;
            }
            let first = whole
                .iter()
                .zip(&pieces)
                .position(|(x, y)| x.to_f64_lossless().to_bits() != y.to_f64_lossless().to_bits());
            if let Some(e) = first {
                bad.push(format!("{lay:?} blocks of {height} rows: element {e}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "rows differ from the one-call product:\n{}",
        bad.join("\n")
    );
}

#[test]
fn f32_rows_do_not_depend_on_the_block_height() {
    rows_do_not_depend_on_the_block_height::<f32>();
}

#[test]
fn f64_rows_do_not_depend_on_the_block_height() {
    rows_do_not_depend_on_the_block_height::<f64>();
}

fn matches_the_f64_triple_loop<T: Real>(eps: f64) {
    const M: usize = 37;
    for (t, lay) in LAYOUTS.iter().enumerate() {
        let (k, n, d) = (lay.k, lay.n, lay.comp);
        let a = values::<T>(M * k * d, 7 + t as u64);
        let b = values::<T>(k * n, 70 + t as u64);
        let mut cm = vec![T::ZERO; M * n * d];
        for c in 0..d {
            lay.run(&a, &b, &mut cm, (0, M), c);
        }
        for i in 0..M {
            for j in 0..n {
                for c in 0..d {
                    let (mut exact, mut abs) = (0.0, 0.0);
                    for p in 0..k {
                        let x = a[i * k * d + p * d + c].to_f64_lossless()
                            * lay.b_at(&b, p, j).to_f64_lossless();
                        exact += x;
                        abs += x.abs();
                    }
                    let got = cm[i * n * d + j * d + c].to_f64_lossless();
                    // Rounding of a k-term sum in any order: k·eps·Σ|terms|.
                    assert!(
                        (got - exact).abs() <= k as f64 * eps * abs,
                        "{lay:?} C[{i},{j},{c}] = {got}, exact {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn f32_matches_the_f64_triple_loop() {
    matches_the_f64_triple_loop::<f32>(f32::EPSILON as f64);
}

#[test]
fn f64_matches_the_f64_triple_loop() {
    matches_the_f64_triple_loop::<f64>(f64::EPSILON);
}

#[test]
fn beta_zero_does_not_read_c_and_beta_one_accumulates() {
    let (m, k, n) = (19, 64, 33);
    let a = values::<f32>(m * k, 3);
    let b = values::<f32>(k * n, 4);
    let mut fresh = vec![f32::NAN; m * n];
    gemm(
        m, k, n, 1.0, &a, k as isize, 1, &b, n as isize, 1, 0.0, &mut fresh, n as isize, 1,
    );
    assert!(
        fresh.iter().all(|v| v.is_finite()),
        "NaN in C leaked through beta = 0"
    );
    // alpha·A·B + 1·C with C = A·B: 3·A·B, to rounding.
    let mut acc = fresh.clone();
    gemm(
        m, k, n, 2.0, &a, k as isize, 1, &b, n as isize, 1, 1.0, &mut acc, n as isize, 1,
    );
    for (x, y) in acc.iter().zip(&fresh) {
        assert!(
            (x - 3.0 * y).abs() <= 1e-5 * (1.0 + y.abs()),
            "{x} vs 3·{y}"
        );
    }
}

#[test]
fn an_empty_inner_dimension_scales_c_by_beta() {
    let (a, b) = (Vec::<f64>::new(), Vec::<f64>::new());
    let mut c = vec![2.0, f64::NAN, 4.0, 8.0];
    gemm(2, 0, 2, 1.0, &a, 0, 1, &b, 2, 1, 0.0, &mut c, 2, 1);
    assert_eq!(c, vec![0.0; 4]);
    let mut c = vec![2.0, 3.0, 4.0, 8.0];
    gemm(2, 0, 2, 1.0, &a, 0, 1, &b, 2, 1, 0.5, &mut c, 2, 1);
    assert_eq!(c, vec![1.0, 1.5, 2.0, 4.0]);
}
