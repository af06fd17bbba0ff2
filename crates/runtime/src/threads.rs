//! The threads backend: every rank a thread of this process, with its own
//! worker pool and memory, consolidated by the caller after joining them.

use crate::consolidate::{combine_rank_results, panic_message};
use crate::rank::{RankBuffers, RankResult};
use crate::split::plan_split;
use crate::{EvalError, EvalOptions, EvalResult};
use ddmlip_atoms::System;
use ddmlip_comm::{thread_world, Communicator, IdleWork, ThreadsConfig};
use ddmlip_engine::helpers::{with_board, HelpBoard};
use ddmlip_engine::Model;
use std::sync::Arc;
use std::time::Instant;

pub(crate) fn evaluate_threads(
    model: &dyn Model,
    batch: &[System],
    opts: &EvalOptions,
    buffers: &mut [RankBuffers],
) -> Result<EvalResult, EvalError> {
    let ranks = opts.ranks;
    let split = plan_split(model, batch, opts, ranks, (Instant::now(), false))?;
    let board = opts.work_sharing.then(HelpBoard::new);
    let idle = board
        .clone()
        .map(|b| -> IdleWork { Arc::new(move || b.help()) });
    let comms = thread_world(
        ranks,
        ThreadsConfig {
            timeout: opts.timeout,
            idle,
        },
    )
    .map_err(|e| EvalError::Input(format!("cannot start {ranks} ranks: {e}")))?;
    let threads = match opts.threads_per_rank {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()) / ranks,
        t => t,
    }
    .max(1);
    let outcomes: Vec<Result<RankResult, EvalError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(buffers.iter_mut())
            .map(|(comm, held)| {
                let split = &split;
                let board = board.clone();
                scope.spawn(move || {
                    let rank = comm.rank();
                    let comm: Box<dyn Communicator> = Box::new(comm);
                    // Out of `held` for the call, which borrows the rest.
                    let pool = held.take_pool(rank, threads);
                    let body = || {
                        let run = || held.run_rank(model, batch, split, comm, opts);
                        match board {
                            Some(board) => with_board(board, run),
                            None => run(),
                        }
                    };
                    let out = match &pool {
                        Some((_, pool)) => pool.install(body),
                        // Without a private pool the rank still runs, on the
                        // caller's pool.
                        None => body(),
                    };
                    held.pool = pool;
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|p| {
                    Err(EvalError::RankFailed {
                        rank,
                        message: panic_message(&*p),
                    })
                })
            })
            .collect()
    });
    let mut result = combine_rank_results(outcomes, batch, split.parts)?;
    result.diagnostics.partition_s = split.partition_s;
    result.diagnostics.finish_s = split.started.elapsed().as_secs_f64();
    Ok(result)
}
