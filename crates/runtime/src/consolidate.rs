//! Consolidation: every rank's owned rows placed by global atom id, and the
//! per-system outputs and stress from rank 0's share.

use crate::inputs::{has_stress, stress_from_strain_grad};
use crate::rank::RankResult;
use crate::{EvalError, EvalResult, OutputData};
use ddmlip_atoms::System;
use ddmlip_comm::Communicator;
use ddmlip_domain::Partition;
use ddmlip_engine::EngineError;
use ddmlip_spec::OutputKind;
use std::collections::BTreeMap;

/// Assembles the threads ranks' shares into one result, or returns the
/// root-cause failure.
pub(crate) fn combine_rank_results(
    outcomes: Vec<Result<RankResult, EvalError>>,
    batch: &[System],
    parts: Vec<Partition>,
) -> Result<EvalResult, EvalError> {
    // The root cause comes first, whichever rank saw it: bad input (close
    // atoms, an element the model lacks) is bad input on any rank count,
    // then a failed rank, then a model error; a peer's communication error
    // only echoes one of those.
    let rank_of = |e: &EvalError| match e {
        EvalError::Input(_) | EvalError::Engine(EngineError::Input(_)) => 0,
        EvalError::RankFailed { .. } => 1,
        EvalError::Engine(EngineError::Comm { .. }) => 3,
        EvalError::Engine(_) => 2,
    };
    let first_err = outcomes
        .iter()
        .filter_map(|o| o.as_ref().err())
        .min_by_key(|e| rank_of(e))
        .cloned();
    if let Some(e) = first_err {
        return Err(e);
    }
    let mut shares = Vec::with_capacity(outcomes.len());
    let mut traces = Vec::new();
    let mut profiles = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut bytes = 0;
    let mut sizes = Vec::new();
    let mut timings = Vec::new();
    for r in outcomes.into_iter().flatten() {
        shares.extend(r.share);
        traces.extend(r.trace);
        profiles.extend(r.profile);
        for (k, v) in r.handler_counts {
            *counts.entry(k).or_insert(0) += v;
        }
        bytes += r.bytes_sent;
        sizes.push(r.sizes);
        timings.push(r.timings);
    }
    if shares.len() != sizes.len() {
        return Err(EvalError::Input("a rank produced no outputs".into()));
    }
    let mut result = assemble_shares(batch, shares)?;
    result.diagnostics.traces = traces;
    result.diagnostics.profiles = profiles;
    result.diagnostics.handler_counts = counts;
    result.diagnostics.bytes_sent = bytes;
    result.diagnostics.rank_sizes = sizes;
    result.diagnostics.rank_timings = timings;
    result.diagnostics.partitions = parts;
    Ok(result)
}

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "panic".to_string()
    }
}

/// One rank's part of the outputs before consolidation: its owned rows of
/// every per-atom output, tagged with batch-level atom ids, and the
/// per-system outputs (already summed over ranks, the same on every rank).
#[derive(Debug)]
pub(crate) struct RankShare {
    /// Batch-level atom id of each owned row.
    pub(crate) globals: Vec<u64>,
    /// (name, width, owned rows × width).
    pub(crate) per_atom: Vec<(String, usize, Vec<f64>)>,
    /// (name, width, systems × width).
    pub(crate) per_system: Vec<(String, usize, Vec<f64>)>,
    /// ∂E/∂ε per system (9 each), summed over ranks.
    pub(crate) strain_grad: Vec<f64>,
}

/// Collects every rank's owned rows over `comm` (an all-gather: the
/// communicator has no rooted gather) and assembles the result on rank 0
/// (`None` on the other ranks).
pub(crate) fn gather_shares(
    comm: &dyn Communicator,
    batch: &[System],
    share: RankShare,
) -> Result<Option<EvalResult>, EvalError> {
    let comm_err = |e: ddmlip_comm::CommError| {
        EvalError::Engine(EngineError::Comm {
            op: "gather outputs".into(),
            message: e.to_string(),
        })
    };
    let ids = comm.all_gather_u64(&share.globals).map_err(comm_err)?;
    let mut rows = Vec::with_capacity(share.per_atom.len());
    for (_, _, v) in &share.per_atom {
        rows.push(comm.all_gather_f64(v).map_err(comm_err)?);
    }
    if comm.rank() != 0 {
        return Ok(None);
    }
    let mut shares: Vec<RankShare> = ids
        .into_iter()
        .map(|globals| RankShare {
            globals,
            per_atom: Vec::new(),
            per_system: Vec::new(),
            strain_grad: Vec::new(),
        })
        .collect();
    for ((name, width, _), per_rank) in share.per_atom.iter().zip(rows) {
        for (s, v) in shares.iter_mut().zip(per_rank) {
            s.per_atom.push((name.clone(), *width, v));
        }
    }
    if let Some(first) = shares.first_mut() {
        first.per_system = share.per_system;
        first.strain_grad = share.strain_grad;
    }
    assemble_shares(batch, shares).map(Some)
}

/// The consolidated result from every rank's share (index = rank): per-atom
/// rows placed by atom id, per-system outputs and stress from rank 0's share.
fn assemble_shares(batch: &[System], mut shares: Vec<RankShare>) -> Result<EvalResult, EvalError> {
    let n_atoms: usize = batch.iter().map(|s| s.len()).sum();
    let mut result = EvalResult {
        has_stress: batch.iter().map(has_stress).collect(),
        ..Default::default()
    };
    let Some(first) = shares.first_mut() else {
        return Ok(result);
    };
    let per_system = std::mem::take(&mut first.per_system);
    let strain_grad = std::mem::take(&mut first.strain_grad);
    let layout: Vec<(String, usize)> = first
        .per_atom
        .iter()
        .map(|(name, width, _)| (name.clone(), *width))
        .collect();
    for (k, (name, width)) in layout.into_iter().enumerate() {
        let mut values = vec![f64::NAN; n_atoms * width];
        for (rank, share) in shares.iter().enumerate() {
            // Every rank records the same outputs; a mismatch is a bug, not
            // something to paper over with NaN rows.
            let rows = match share.per_atom.get(k) {
                Some((n, w, rows))
                    if *n == name && *w == width && rows.len() == share.globals.len() * width =>
                {
                    rows
                }
                _ => {
                    return Err(EvalError::RankFailed {
                        rank,
                        message: format!("its per-atom output `{name}` does not match rank 0's"),
                    })
                }
            };
            for (row, &id) in share.globals.iter().enumerate() {
                let id = id as usize;
                values[id * width..(id + 1) * width]
                    .copy_from_slice(&rows[row * width..(row + 1) * width]);
            }
        }
        result.outputs.insert(
            name,
            OutputData {
                kind: OutputKind::PerAtom,
                width,
                values,
            },
        );
    }
    for (name, width, values) in per_system {
        result.outputs.insert(
            name,
            OutputData {
                kind: OutputKind::PerSystem,
                width,
                values,
            },
        );
    }
    result.outputs.insert(
        "stress".into(),
        OutputData {
            kind: OutputKind::PerSystem,
            width: 6,
            values: stress_from_strain_grad(&strain_grad, batch),
        },
    );
    Ok(result)
}
