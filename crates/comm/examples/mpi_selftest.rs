//! MPI self-test: `mpirun -n N mpi_selftest` checks exchange, all-reduce and
//! all-gather against closed-form expectations and prints
//! `mpi selftest ok size=N` on rank 0.
//!
//! `mpi_selftest abort R` makes rank R abort (with message
//! `deliberate failure on rank R`) while the other ranks wait in a receive
//! from it; the job must end with a non-zero exit code.

use std::process::ExitCode;

use ddmlip_comm::{CommError, Communicator, MpiCommunicator};

/// Value identifying (source, destination, element index) uniquely.
fn token(src: usize, dst: usize, k: usize) -> f64 {
    (src * 1_000_000 + dst * 1000 + k) as f64 + 0.25
}

fn check(condition: bool, what: &str) -> Result<(), String> {
    if condition {
        Ok(())
    } else {
        Err(what.to_string())
    }
}

fn selftest(comm: &dyn Communicator) -> Result<(), String> {
    let err = |e: CommError| e.to_string();
    let (rank, size) = (comm.rank(), comm.size());

    // All-to-all exchange including self, with per-pair sizes.
    let payloads: Vec<Vec<f64>> = (0..size)
        .map(|dst| (0..dst + rank + 1).map(|k| token(rank, dst, k)).collect())
        .collect();
    let sends: Vec<(usize, &[f64])> = payloads
        .iter()
        .enumerate()
        .map(|(dst, p)| (dst, p.as_slice()))
        .collect();
    let recv_from: Vec<usize> = (0..size).rev().collect();
    let received = comm.exchange_f64(&sends, &recv_from, 5).map_err(err)?;
    for (i, &src) in recv_from.iter().enumerate() {
        let expected: Vec<f64> = (0..rank + src + 1).map(|k| token(src, rank, k)).collect();
        check(received[i] == expected, "exchange_f64 payload")?;
    }

    // Ring exchange of ids, with the neighbour appearing twice.
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let first = [rank as u64 * 10];
    let second = [rank as u64 * 10 + 1, 7];
    let ids = comm
        .exchange_u64(&[(next, &first[..]), (next, &second[..])], &[prev, prev], 6)
        .map_err(err)?;
    check(
        ids == vec![vec![prev as u64 * 10], vec![prev as u64 * 10 + 1, 7]],
        "exchange_u64 order",
    )?;

    // All-reduce: Σ_r (r + 1) · (i + 1) = (i + 1) · P(P + 1)/2 exactly.
    let mut values: Vec<f64> = (0..5).map(|i| ((rank + 1) * (i + 1)) as f64).collect();
    comm.all_reduce_sum_f64(&mut values).map_err(err)?;
    let triangle = (size * (size + 1) / 2) as f64;
    for (i, &v) in values.iter().enumerate() {
        check(v == (i + 1) as f64 * triangle, "all_reduce_sum_f64 value")?;
    }
    let mut values32 = [rank as f32 + 1.0];
    comm.all_reduce_sum_f32(&mut values32).map_err(err)?;
    check(values32[0] == triangle as f32, "all_reduce_sum_f32 value")?;

    // Bitwise replication of an inexact sum: gather every rank's bits.
    let mut inexact = [0.1 * (rank as f64 + 1.0) / 3.0, 1e16 / (rank as f64 + 1.0)];
    comm.all_reduce_sum_f64(&mut inexact).map_err(err)?;
    let bits: Vec<u64> = inexact.iter().map(|x| x.to_bits()).collect();
    let all_bits = comm.all_gather_u64(&bits).map_err(err)?;
    check(
        all_bits.iter().all(|b| *b == bits),
        "all-reduce bitwise identical",
    )?;

    // All-gather with variable sizes and every element type.
    let mine: Vec<f64> = (0..rank).map(|k| token(rank, 0, k)).collect();
    let gathered = comm.all_gather_f64(&mine).map_err(err)?;
    for (r, g) in gathered.iter().enumerate() {
        let expected: Vec<f64> = (0..r).map(|k| token(r, 0, k)).collect();
        check(*g == expected, "all_gather_f64")?;
    }
    let text = format!("rank{rank}");
    let names = comm.all_gather_bytes(text.as_bytes()).map_err(err)?;
    for (r, name) in names.iter().enumerate() {
        check(*name == format!("rank{r}").into_bytes(), "all_gather_bytes")?;
    }
    let small = comm.all_gather_u32(&[rank as u32; 2]).map_err(err)?;
    check(
        small
            .iter()
            .enumerate()
            .all(|(r, v)| *v == vec![r as u32; 2]),
        "all_gather_u32",
    )?;

    comm.barrier().map_err(err)?;
    Ok(())
}

fn main() -> ExitCode {
    let comm = match MpiCommunicator::init() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("mpi selftest: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("abort") {
        let failing: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
        if comm.rank() == failing {
            std::thread::sleep(std::time::Duration::from_millis(200));
            comm.abort(&format!("deliberate failure on rank {failing}"));
        }
        // The others wait for a message that never comes; only the abort
        // ends them.
        let outcome = comm.recv_f64(failing, 0);
        eprintln!("rank {}: unexpectedly returned {outcome:?}", comm.rank());
        return ExitCode::SUCCESS;
    }
    match selftest(&comm) {
        Ok(()) => {
            if comm.rank() == 0 {
                println!("mpi selftest ok size={}", comm.size());
            }
            ExitCode::SUCCESS
        }
        Err(what) => {
            comm.abort(&format!("selftest failed: {what}"));
            ExitCode::FAILURE
        }
    }
}
