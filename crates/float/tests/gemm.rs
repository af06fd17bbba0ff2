//! `gemm` against the naive triple loop, and its bounds check.

use ddmlip_float::{gemm, Real};

#[test]
fn gemm_matches_the_naive_product() {
    let (m, k, n) = (3, 4, 2);
    let a: Vec<f64> = (0..m * k).map(|x| x as f64 * 0.5 - 1.0).collect();
    let b: Vec<f64> = (0..k * n).map(|x| 1.0 / (x as f64 + 1.0)).collect();
    let mut c = vec![1.0; m * n];
    gemm(
        m, k, n, 2.0, &a, k as isize, 1, &b, n as isize, 1, 0.5, &mut c, n as isize, 1,
    );
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            assert!((c[i * n + j] - (2.0 * dot + 0.5)).abs() < 1e-12);
        }
    }
}

#[test]
fn transposed_strides_read_column_major_views() {
    // A given column-major (rs = 1, cs = m): C = Aᵀᵀ·B is the same product.
    let (m, k, n) = (2, 3, 2);
    let a_row: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let a_col: Vec<f32> = vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0];
    let b: Vec<f32> = vec![1.0, 0.5, -1.0, 2.0, 0.25, 1.0];
    let (mut c1, mut c2) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
    gemm(m, k, n, 1.0, &a_row, 3, 1, &b, 2, 1, 0.0, &mut c1, 2, 1);
    gemm(m, k, n, 1.0, &a_col, 1, 2, &b, 2, 1, 0.0, &mut c2, 2, 1);
    assert_eq!(c1, c2);
    assert_eq!(c1, vec![-0.25, 7.5, 0.5, 18.0]);
}

#[test]
#[should_panic(expected = "outside its slice")]
fn gemm_refuses_a_view_past_the_end() {
    let a = vec![1.0f32; 5]; // 2×3 needs 6
    let b = vec![1.0f32; 3];
    let mut c = vec![0.0f32; 2];
    gemm(2, 3, 1, 1.0, &a, 3, 1, &b, 1, 1, 0.0, &mut c, 1, 1);
}

#[test]
#[should_panic(expected = "outside its slice")]
fn gemm_refuses_negative_strides() {
    let a = vec![1.0f64; 4];
    let b = vec![1.0f64; 4];
    let mut c = vec![0.0f64; 4];
    gemm(2, 2, 2, 1.0, &a, -2, 1, &b, 2, 1, 0.0, &mut c, 2, 1);
}

#[test]
fn conversions_round_trip_through_f64() {
    assert_eq!(f32::from_f64(0.1).to_f64_lossless(), 0.1f32 as f64);
    assert_eq!(f64::from_f64(0.1).to_f64_lossless(), 0.1);
    assert_eq!(<f32 as Real>::ZERO + <f32 as Real>::ONE, 1.0);
}
