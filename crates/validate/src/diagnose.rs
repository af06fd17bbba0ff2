//! Diagnostics of a decomposed run, in causal order: partition health, halo
//! completeness, first divergent op, translated errors.

use crate::{HaloCompleteness, LayerDivergence, MissingNeighbors, TranslatedError};
use ddmlip_atoms::System;
use ddmlip_domain::Partition;
use ddmlip_engine::{EngineError, Phase, RowDomain, Trace, TraceEvent};
use ddmlip_neighbors::{neighbor_list, NeighborOptions};
use ddmlip_runtime::{EvalError, EvalResult, NEIGHBOR_COUNTS};

/// Ops the distributed handlers insert around model ops; they have no
/// counterpart in the single-process trace.
const HANDLER_OPS: [&str; 5] = [
    "halo_refresh",
    "halo_reverse_sum",
    "all_reduce",
    "slice_owned",
    "pad_ghosts",
];

/// A model op with the value the model actually received (after the
/// handlers that followed it).
#[derive(Debug, Clone)]
struct ModelOp<'a> {
    event: &'a TraceEvent,
    /// Depends on absolute positions (frame-dependent, not comparable).
    absolute: bool,
    sum: f64,
    sum_sq: f64,
    replicated: bool,
}

fn model_ops(trace: &Trace) -> Vec<ModelOp<'_>> {
    // Owned atoms of a rank sit wrapped into the cell while the reference
    // keeps the input positions, so values of absolute positions differ by
    // lattice vectors without being wrong. Such ops are marked and skipped;
    // edge vectors, lengths and pair sums (of differences) are frame-free
    // again.
    let mut absolute: std::collections::HashSet<usize> = std::collections::HashSet::new();
    for e in trace.events.iter().filter(|e| e.phase == Phase::Forward) {
        let from_positions = e.op == "leaf" && e.output.domain == RowDomain::Atom;
        let frame_free =
            e.op == "edge_vectors" || e.op == "edge_lengths" || e.op.starts_with("pair_sum:");
        let inherits = !frame_free && e.input_ids.iter().any(|i| absolute.contains(i));
        if from_positions || inherits {
            absolute.insert(e.output_id);
        }
    }
    let fwd: Vec<&TraceEvent> = trace
        .events
        .iter()
        .filter(|e| e.phase == Phase::Forward && e.op != "neighbor_list")
        .collect();
    let mut out: Vec<ModelOp<'_>> = Vec::new();
    let mut k = 0;
    while k < fwd.len() {
        let e = fwd[k];
        k += 1;
        if HANDLER_OPS.contains(&e.op.as_str()) {
            continue;
        }
        let mut op = ModelOp {
            absolute: absolute.contains(&e.output_id),
            event: e,
            sum: e.owned_sum,
            sum_sq: e.owned_sum_sq,
            replicated: e.replicated,
        };
        let mut current = e.output_id;
        // Follow the handler chain applied to this op's output.
        while k < fwd.len()
            && HANDLER_OPS.contains(&fwd[k].op.as_str())
            && fwd[k].input_ids.first() == Some(&current)
        {
            op.sum = fwd[k].owned_sum;
            op.sum_sq = fwd[k].owned_sum_sq;
            op.replicated = fwd[k].replicated;
            current = fwd[k].output_id;
            k += 1;
        }
        out.push(op);
    }
    out
}

/// Finds the first forward op whose value summed over ranks departs from the
/// reference. Atom rows count owned rows only, so the sum over ranks covers
/// every atom once; replicated values are taken from rank 0; Edge rows are
/// compared only when the runtime graph (owned-centred edges) is in use.
pub(crate) fn layer_divergence(
    reference: &Trace,
    ranks: &[Trace],
    compare_edges: bool,
    rel_tol: f64,
) -> Option<LayerDivergence> {
    let r_ops = model_ops(reference);
    let per_rank: Vec<Vec<ModelOp<'_>>> = ranks.iter().map(model_ops).collect();
    if per_rank.is_empty() {
        return None;
    }
    let mut checked = 0;
    let mut max_rel: f64 = 0.0;
    for (pos, r) in r_ops.iter().enumerate() {
        let ev = r.event;
        let mut ops = Vec::with_capacity(per_rank.len());
        for (rank, list) in per_rank.iter().enumerate() {
            match list.get(pos) {
                Some(o) if o.event.op == ev.op => ops.push(o),
                other => {
                    return Some(LayerDivergence {
                        first_divergent: true,
                        op: ev.op.clone(),
                        scope: ev.scope.clone(),
                        seq: ev.seq,
                        reference_sum: r.sum,
                        ranks_sum: f64::NAN,
                        rel_diff: f64::INFINITY,
                        checked,
                        max_rel_diff: max_rel,
                        note: format!(
                            "rank {rank} ran a different op sequence: op #{pos} is `{}` there, `{}` in the reference",
                            other.map(|o| o.event.op.as_str()).unwrap_or("(end of trace)"),
                            ev.op
                        ),
                    })
                }
            }
        }
        let domain = ev.output.domain;
        let comparable = match domain {
            RowDomain::Atom | RowDomain::System => true,
            RowDomain::Edge => compare_edges,
            RowDomain::None => false,
        };
        if !comparable || r.absolute || ev.op == "leaf" || ev.op == "constant" {
            continue;
        }
        let (sum, sum_sq) = if ops.iter().all(|o| o.replicated) {
            (ops[0].sum, ops[0].sum_sq)
        } else {
            (
                ops.iter().map(|o| o.sum).sum::<f64>(),
                ops.iter().map(|o| o.sum_sq).sum::<f64>(),
            )
        };
        checked += 1;
        let scale = r.sum.abs().max(r.sum_sq.sqrt()).max(1e-300);
        let rel_sum = (sum - r.sum).abs() / scale;
        let rel_sq = (sum_sq - r.sum_sq).abs() / r.sum_sq.max(1e-300);
        let rel = rel_sum.max(if r.sum_sq > 0.0 { rel_sq } else { 0.0 });
        let rel = if rel.is_nan() { f64::INFINITY } else { rel };
        if rel > rel_tol {
            return Some(LayerDivergence {
                first_divergent: true,
                op: ev.op.clone(),
                scope: ev.scope.clone(),
                seq: ev.seq,
                reference_sum: r.sum,
                ranks_sum: sum,
                rel_diff: rel,
                checked,
                max_rel_diff: max_rel.max(rel),
                note: format!(
                    "{:?}[{}×{}] output{}",
                    domain,
                    ev.output.rows,
                    ev.output.cols,
                    if ev.indices.is_empty() {
                        String::new()
                    } else {
                        format!(" by {}", ev.indices.join(", "))
                    }
                ),
            });
        }
        max_rel = max_rel.max(rel);
    }
    Some(LayerDivergence {
        first_divergent: false,
        op: String::new(),
        scope: String::new(),
        seq: 0,
        reference_sum: 0.0,
        ranks_sum: 0.0,
        rel_diff: 0.0,
        checked,
        max_rel_diff: max_rel,
        note:
            "every forward op agrees summed over ranks: the divergence is after the forward pass \
               (output consolidation such as all_reduce_outputs, or autograd-derived outputs)"
                .into(),
    })
}

/// Reference neighbour count of every atom (batch order) within `radius`.
fn reference_counts(batch: &[System], radius: f64) -> Option<Vec<usize>> {
    let mut counts = Vec::new();
    for sys in batch {
        let nl = neighbor_list(
            &sys.positions,
            sys.cell.as_ref(),
            sys.pbc,
            &NeighborOptions {
                cutoff: radius,
                half: false,
            },
        )
        .ok()?;
        let mut c = vec![0usize; sys.len()];
        for &i in &nl.centers {
            c[i as usize] += 1;
        }
        counts.extend(c);
    }
    Some(counts)
}

/// Every owned atom's neighbour count on its rank against the reference.
///
/// With the runtime's `_neighbor_counts` (runtime-graph models) those counts
/// are the evidence; otherwise each rank's owned + ghost atoms are rebuilt
/// from the partition and counted within `radius` (the model's own graph
/// radius), which is what the model can see there.
pub(crate) fn halo_completeness(
    batch: &[System],
    partitions: &[Partition],
    decomposed: Option<&EvalResult>,
    radius: f64,
    source_runtime: bool,
) -> Option<HaloCompleteness> {
    let reference = reference_counts(batch, radius)?;
    let mut offsets = Vec::with_capacity(batch.len());
    let mut acc = 0;
    for sys in batch {
        offsets.push(acc);
        acc += sys.len();
    }
    // (global batch id, system, rank, seen)
    let mut seen: Vec<(usize, usize, usize, usize)> = Vec::new();
    let runtime_counts = decomposed
        .filter(|_| source_runtime)
        .and_then(|d| d.outputs.get(NEIGHBOR_COUNTS));
    for (s, (sys, part)) in batch.iter().zip(partitions).enumerate() {
        for dom in &part.ranks {
            if let Some(rc) = runtime_counts {
                for &j in &dom.owned {
                    let id = offsets[s] + j;
                    let v = rc.values.get(id).copied().unwrap_or(f64::NAN);
                    let v = if v.is_finite() {
                        v as usize
                    } else {
                        usize::MAX
                    };
                    seen.push((id, s, dom.rank, v));
                }
            } else {
                let local = dom.local_positions(sys);
                let nl = neighbor_list(
                    &local,
                    None,
                    [false; 3],
                    &NeighborOptions {
                        cutoff: radius,
                        half: false,
                    },
                )
                .ok()?;
                let mut c = vec![0usize; dom.owned.len()];
                for &i in &nl.centers {
                    if (i as usize) < c.len() {
                        c[i as usize] += 1;
                    }
                }
                for (k, &j) in dom.owned.iter().enumerate() {
                    seen.push((offsets[s] + j, s, dom.rank, c[k]));
                }
            }
        }
    }
    let mut missing: Vec<MissingNeighbors> = seen
        .iter()
        .filter(|&&(id, _, _, v)| reference.get(id).copied() != Some(v))
        .map(|&(id, s, rank, v)| MissingNeighbors {
            atom: id,
            system: s,
            rank,
            expected: reference.get(id).copied().unwrap_or(0),
            seen: if v == usize::MAX { None } else { Some(v) },
        })
        .collect();
    let n_missing = missing.len();
    missing.truncate(10);
    let ghost_width = partitions.first().map(|p| p.ghost_width).unwrap_or(0.0);
    let total: usize = reference.iter().sum();
    let source = if runtime_counts.is_some() {
        "runtime graph edges per owned atom (`_neighbor_counts`)".to_string()
    } else {
        format!("pairs within {radius:.3} Å among each rank's owned + ghost atoms")
    };
    let interpretation = if n_missing == 0 {
        format!(
            "VERIFIED: all {} owned atoms see the single-process neighbour count within {radius:.3} Å \
             ({total} pairs). The halo is complete; a divergence comes from how ops combine across \
             ranks, not from missing ghosts.",
            seen.len()
        )
    } else {
        format!(
            "INCOMPLETE: {n_missing} of {} owned atoms see fewer (or more) neighbours within \
             {radius:.3} Å than in one process; the ghost width {ghost_width:.3} Å does not cover \
             the model's interaction range. Raise halo_depth (ghost width = halo_depth × cutoff) \
             or declare the model's true cutoff.",
            seen.len()
        )
    };
    Some(HaloCompleteness {
        verified: n_missing == 0,
        radius,
        ghost_width,
        source,
        atoms_checked: seen.len(),
        atoms_missing: n_missing,
        examples: missing,
        interpretation,
    })
}

/// Turns an evaluation error into the cause a model author can act on.
pub(crate) fn translate_error(err: &EvalError, stage: &str) -> TranslatedError {
    let (rank, message) = match err {
        EvalError::RankFailed { rank, message } => (Some(*rank), message.clone()),
        other => (None, other.to_string()),
    };
    let engine = match err {
        EvalError::Engine(e) => Some(e),
        _ => None,
    };
    let where_ = match rank {
        Some(r) => format!("rank {r}"),
        None => stage.to_string(),
    };
    let (kind, op, advice) = if let Some(EngineError::NoBackward { op }) = engine {
        (
            "severed_gradient",
            Some(op.clone()),
            format!(
                "the gradient path from positions to energy is severed at `{op}`, which has no \
                 backward: forces (−∂E/∂r) and stress cannot be computed. Implement \
                 OpaqueKernel::backward for it (or compute it from differentiable ops)."
            ),
        )
    } else if matches!(engine, Some(EngineError::SeveredGradient { .. }))
        || message.contains("severed")
    {
        let op = message
            .split('`')
            .nth(1)
            .filter(|_| message.contains("no backward"))
            .map(str::to_string);
        (
            "severed_gradient",
            op.clone(),
            match op {
                Some(op) => format!(
                    "the gradient path from positions to energy is severed at `{op}` on {where_}, \
                     which has no backward: implement its backward pass."
                ),
                None => format!(
                    "the energy does not depend on the positions through differentiable ops on \
                     {where_} (severed gradient path): an op rebuilt a value as a constant or \
                     dropped a returned tensor. Keep every op between positions and energy on \
                     the graph."
                ),
            },
        )
    } else if let Some(EngineError::NonFinite { op, what }) = engine {
        (
            "non_finite",
            Some(op.clone()),
            format!(
                "the first NaN/inf appeared in `{op}` ({what}) on {where_}: look at its inputs \
                 (a zero distance, a log/sqrt of a negative value, an overflow)."
            ),
        )
    } else if message.contains("non-finite") {
        let op = message.split('`').nth(1).map(str::to_string);
        (
            "non_finite",
            op.clone(),
            format!(
                "the first NaN/inf appeared in `{}` on {where_}: look at its inputs (a zero \
                 distance, a log/sqrt of a negative value, an overflow).",
                op.unwrap_or_default()
            ),
        )
    } else if let Some(r) = rank {
        (
            "rank_failed",
            None,
            format!(
                "rank {r} failed while the others ran: {message}. Every peer was released by \
                 the abort (no hang). Look for code that runs only under decomposition or only \
                 on some ranks (a rank-dependent branch, an empty domain, ghost-row indexing)."
            ),
        )
    } else if matches!(engine, Some(EngineError::Comm { .. })) {
        (
            "communication",
            None,
            format!(
                "communication failed: {message}. A peer failed or a collective timed out; \
                 raise --timeout for very large systems."
            ),
        )
    } else {
        ("error", None, format!("{where_} failed: {message}"))
    };
    TranslatedError {
        stage: stage.to_string(),
        kind: kind.to_string(),
        rank,
        op,
        message,
        advice,
    }
}
