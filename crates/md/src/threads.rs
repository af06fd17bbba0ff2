//! Running an MD job as N thread ranks of this process.

use crate::driver::{run_rank, MdConfig, MdSink, MdSummary, StartState};
use crate::state::Topology;
use crate::MdError;
use ddmlip_comm::{thread_world, Communicator, IdleWork, ThreadsConfig, DEFAULT_TIMEOUT};
use ddmlip_engine::helpers::{with_board, HelpBoard};
use ddmlip_engine::Model;
use std::sync::Arc;

/// Runs the job on `ranks` thread ranks; rank 0 writes to `sink`. Each rank
/// runs inside its own rayon pool of cores / ranks workers, and ranks that
/// wait for a message run pieces of the ops of ranks still working (the
/// results are the same bits whoever runs a piece).
pub fn run_threads(
    model: &dyn Model,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    ranks: usize,
    sink: &mut dyn MdSink,
) -> Result<MdSummary, MdError> {
    config.check()?;
    if ranks == 0 {
        return Err(MdError::Input("--ranks must be at least 1".into()));
    }
    let board = HelpBoard::new();
    let idle: IdleWork = {
        let b = board.clone();
        Arc::new(move || b.help())
    };
    let comms = thread_world(
        ranks,
        ThreadsConfig {
            timeout: DEFAULT_TIMEOUT,
            idle: Some(idle),
        },
    )
    .map_err(|e| MdError::Input(format!("cannot start {ranks} ranks: {e}")))?;
    let threads = (std::thread::available_parallelism().map_or(1, |n| n.get()) / ranks).max(1);
    let mut sink = Some(sink);
    let outcomes: Vec<Result<Option<MdSummary>, MdError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let rank = comm.rank();
                let my_sink = if rank == 0 { sink.take() } else { None };
                let board = board.clone();
                scope.spawn(move || {
                    let body = || {
                        with_board(board, || {
                            run_rank(model, topology, start, config, Box::new(comm), my_sink)
                        })
                    };
                    match rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .thread_name(move |k| format!("md-rank{rank}-worker{k}"))
                        .build()
                    {
                        Ok(pool) => pool.install(body),
                        Err(_) => body(),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(MdError::RankFailed {
                        rank,
                        message: "panicked".into(),
                    })
                })
            })
            .collect()
    });
    // A rank's own error comes first; a peer's communication failure only
    // echoes it.
    let mut first_comm_err = None;
    let mut summary = None;
    for (rank, o) in outcomes.into_iter().enumerate() {
        match o {
            Ok(Some(s)) if rank == 0 => summary = Some(s),
            Ok(_) => {}
            Err(
                e @ (MdError::Comm(_) | MdError::Engine(ddmlip_engine::EngineError::Comm { .. })),
            ) => {
                first_comm_err.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = first_comm_err {
        return Err(e);
    }
    summary.ok_or_else(|| MdError::Internal("rank 0 returned no summary".into()))
}
