//! `ddmlip bench gemm`: the f32 GEMM rate of this machine (matrixmultiply
//! sgemm), single thread and split over row blocks on a rayon pool, as the
//! engine splits it.

use super::stats::{cores, median};
use crate::error::CliError;
use anyhow::anyhow;
use clap::Args;
use serde::Serialize;
use std::time::Instant;

#[derive(Args)]
pub struct GemmBenchArgs {
    /// GEMM shapes `MxKxN` (C = A·B, A is M×K), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "65536x64x64,65536x64x960,1024x1024x1024"
    )]
    shapes: Vec<String>,
    /// Rayon threads for the row-block-parallel run. Default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Timed calls per shape; the median is reported.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// One GEMM shape of `bench gemm`.
#[derive(Debug, Serialize)]
struct GemmRecord {
    m: usize,
    k: usize,
    n: usize,
    /// One sgemm call from one thread (GFLOP/s, 2·M·K·N per call);
    /// matrixmultiply adds `MATMUL_NUM_THREADS` threads of its own (1 unless set).
    single_thread_gflops: f64,
    /// Row blocks of 256 on the rayon pool, one sgemm each (GFLOP/s).
    parallel_gflops: f64,
    threads: usize,
}

fn parse_shape(s: &str) -> Result<(usize, usize, usize), CliError> {
    let dims: Vec<usize> = s
        .split('x')
        .map(|d| d.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| CliError::input(anyhow!("shape `{s}`: expected MxKxN")))?;
    match dims.as_slice() {
        [m, k, n] if *m > 0 && *k > 0 && *n > 0 => Ok((*m, *k, *n)),
        _ => Err(CliError::input(anyhow!(
            "shape `{s}`: expected MxKxN, all positive"
        ))),
    }
}

/// `c = a·b`, row-major, one matrixmultiply call.
fn sgemm(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: the assert above keeps every strided access inside the slices;
    // `c` is a unique borrow, so it aliases neither input.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

pub fn run(g: &GemmBenchArgs) -> Result<u8, CliError> {
    use rayon::prelude::*;
    const ROW_BLOCK: usize = 256;
    if g.repeats == 0 || g.threads == Some(0) {
        return Err(CliError::input(anyhow!(
            "--repeats and --threads must be at least 1"
        )));
    }
    let shapes: Vec<_> = g
        .shapes
        .iter()
        .map(|s| parse_shape(s))
        .collect::<Result<_, _>>()?;
    let threads = g.threads.unwrap_or_else(cores);
    // matrixmultiply reads this once, at its first call: pin it to one thread
    // (unless the caller chose otherwise) so that "single thread" is one
    // thread and the row-block run is not oversubscribed. Still
    // single-threaded here, so changing the environment is sound.
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", "1");
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(CliError::failed)?;
    let mut records = Vec::new();
    for (m, k, n) in shapes {
        let mut w = ddmlip_models::init::Weights::new(7);
        let a: Vec<f32> = (0..m * k).map(|_| w.uniform() as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|_| w.uniform() as f32).collect();
        let mut c = vec![0f32; m * n];
        let flops = 2.0 * (m * k * n) as f64;
        let mut time = |f: &mut dyn FnMut(&mut [f32])| {
            f(&mut c);
            let t: Vec<f64> = (0..g.repeats)
                .map(|_| {
                    let t0 = Instant::now();
                    f(&mut c);
                    t0.elapsed().as_secs_f64()
                })
                .collect();
            flops / median(&t) / 1e9
        };
        let single = time(&mut |c: &mut [f32]| sgemm(&a, &b, c, m, k, n));
        let parallel = time(&mut |c: &mut [f32]| {
            pool.install(|| {
                c.par_chunks_mut(ROW_BLOCK * n)
                    .zip(a.par_chunks(ROW_BLOCK * k))
                    .for_each(|(cb, ab)| sgemm(ab, &b, cb, ab.len() / k, k, n));
            })
        });
        records.push(GemmRecord {
            m,
            k,
            n,
            single_thread_gflops: single,
            parallel_gflops: parallel,
            threads,
        });
    }
    if g.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&records).map_err(CliError::failed)?
        );
    } else {
        println!(
            "f32 GEMM (matrixmultiply sgemm; MATMUL_NUM_THREADS={})",
            std::env::var("MATMUL_NUM_THREADS").unwrap_or_else(|_| "unset".into())
        );
        println!(
            "{:>20} {:>14} {:>22}",
            "M x K x N", "1 call GFLOP/s", "row blocks GFLOP/s"
        );
        for r in &records {
            println!(
                "{:>20} {:>14.1} {:>15.1} ({} thr)",
                format!("{}x{}x{}", r.m, r.k, r.n),
                r.single_thread_gflops,
                r.parallel_gflops,
                r.threads
            );
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgemm_matches_naive_product() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut c = vec![0f32; m * n];
        sgemm(&a, &b, &mut c, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
                assert!((c[i * n + j] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn shapes_parse_and_reject() {
        assert_eq!(parse_shape("8x64x960").ok(), Some((8, 64, 960)));
        assert!(parse_shape("8x64").is_err());
        assert!(parse_shape("0x1x1").is_err());
        assert!(parse_shape("axbxc").is_err());
    }
}
