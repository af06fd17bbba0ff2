//! Running a job as N thread ranks of this process.

use crate::config::{MdConfig, StartState};
use crate::driver::{run_rank, run_rank_with_force_field};
use crate::force_field::RankForceField;
use crate::relax::{relax_rank, relax_rank_with_force_field, RelaxConfig, RelaxSummary};
use crate::sink::{MdSink, MdSummary};
use crate::state::Topology;
use crate::MdError;
use ddmlip_atoms::Cell;
use ddmlip_comm::{thread_world, Communicator, IdleWork, ThreadsConfig, DEFAULT_TIMEOUT};
use ddmlip_engine::helpers::{with_board, HelpBoard};
use ddmlip_engine::{EngineError, Model};
use std::sync::{Arc, Mutex};

/// Runs `body` as every rank of an `ranks`-thread world and returns rank 0's
/// result. Each rank runs inside its own rayon pool of cores / ranks
/// workers, and ranks that wait for a message run pieces of the ops of ranks
/// still working (the results are the same bits whoever runs a piece).
fn on_thread_ranks<R: Send>(
    ranks: usize,
    body: impl Fn(Box<dyn Communicator>) -> Result<Option<R>, MdError> + Sync,
) -> Result<R, MdError> {
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
    let body = &body;
    let outcomes: Vec<Result<Option<R>, MdError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let rank = comm.rank();
                let board = board.clone();
                scope.spawn(move || {
                    let run = || with_board(board, || body(Box::new(comm)));
                    match rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .thread_name(move |k| format!("md-rank{rank}-worker{k}"))
                        .build()
                    {
                        Ok(pool) => pool.install(run),
                        Err(_) => run(),
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
    let mut result = None;
    for (rank, o) in outcomes.into_iter().enumerate() {
        match o {
            Ok(Some(s)) if rank == 0 => result = Some(s),
            Ok(_) => {}
            Err(e @ (MdError::Comm(_) | MdError::Engine(EngineError::Comm { .. }))) => {
                first_comm_err.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = first_comm_err {
        return Err(e);
    }
    result.ok_or_else(|| MdError::Internal("rank 0 returned no result".into()))
}

/// Runs an MD job on `ranks` thread ranks; rank 0 writes to `sink`.
pub fn run_threads(
    model: &dyn Model,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    ranks: usize,
    sink: &mut dyn MdSink,
) -> Result<MdSummary, MdError> {
    config.check()?;
    let sink = Mutex::new(Some(sink));
    on_thread_ranks(ranks, |comm| {
        let mine = if comm.rank() == 0 {
            sink.lock().ok().and_then(|mut s| s.take())
        } else {
            None
        };
        run_rank(model, topology, start, config, comm, mine)
    })
}

/// Relaxes a structure on `ranks` thread ranks.
pub fn relax_threads(
    model: &dyn Model,
    topology: &Topology,
    cell: Cell,
    positions: &[[f64; 3]],
    config: &RelaxConfig,
    ranks: usize,
) -> Result<RelaxSummary, MdError> {
    config.check()?;
    on_thread_ranks(ranks, |comm| {
        relax_rank(model, topology, cell, positions, config, comm)
    })
}

/// Runs an MD job on one thread rank per entry of `fields`, each rank's
/// forces from its own field (see [`RankForceField`]); `model` gives the
/// cutoff and spec of the ranks' rows and is never evaluated. Rank 0
/// writes to `sink`.
pub fn run_threads_with_fields(
    model: &dyn Model,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    fields: Vec<Box<dyn RankForceField>>,
    sink: &mut dyn MdSink,
) -> Result<MdSummary, MdError> {
    config.check()?;
    let ranks = fields.len();
    let fields: Vec<Mutex<Box<dyn RankForceField>>> = fields.into_iter().map(Mutex::new).collect();
    let sink = Mutex::new(Some(sink));
    on_thread_ranks(ranks, |comm| {
        let mine = if comm.rank() == 0 {
            sink.lock().ok().and_then(|mut s| s.take())
        } else {
            None
        };
        let mut field = rank_field(&fields, comm.rank())?;
        run_rank_with_force_field(model, topology, start, config, comm, mine, field.as_mut())
    })
}

/// Relaxes a structure on one thread rank per entry of `fields`, each
/// rank's forces from its own field; `model` as in
/// [`run_threads_with_fields`].
pub fn relax_threads_with_fields(
    model: &dyn Model,
    topology: &Topology,
    cell: Cell,
    positions: &[[f64; 3]],
    config: &RelaxConfig,
    fields: Vec<Box<dyn RankForceField>>,
) -> Result<RelaxSummary, MdError> {
    config.check()?;
    let ranks = fields.len();
    let fields: Vec<Mutex<Box<dyn RankForceField>>> = fields.into_iter().map(Mutex::new).collect();
    on_thread_ranks(ranks, |comm| {
        let mut field = rank_field(&fields, comm.rank())?;
        relax_rank_with_force_field(
            model,
            topology,
            cell,
            positions,
            config,
            comm,
            field.as_mut(),
        )
    })
}

/// Rank `rank`'s force field (each is locked by its rank alone).
fn rank_field(
    fields: &[Mutex<Box<dyn RankForceField>>],
    rank: usize,
) -> Result<std::sync::MutexGuard<'_, Box<dyn RankForceField>>, MdError> {
    fields
        .get(rank)
        .ok_or_else(|| MdError::Internal(format!("no force field for rank {rank}")))?
        .lock()
        .map_err(|_| MdError::Internal(format!("rank {rank}'s force field was poisoned")))
}

/// The communicator of a one-rank world (a run whose forces come from a
/// whole-system force field).
pub(crate) fn single_rank_comm() -> Result<Box<dyn Communicator>, MdError> {
    let comm = thread_world(
        1,
        ThreadsConfig {
            timeout: DEFAULT_TIMEOUT,
            idle: None,
        },
    )
    .map_err(|e| MdError::Input(format!("cannot start one rank: {e}")))?
    .pop()
    .ok_or_else(|| MdError::Internal("a one-rank world without its rank".into()))?;
    Ok(Box::new(comm))
}
