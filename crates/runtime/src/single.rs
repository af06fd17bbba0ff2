//! The single-process run: the whole batch on one graph.

use crate::inputs::{
    build_inputs, check_energy_shape, close_atoms_error, has_stress, lap, outputs_to_host,
    place_on_device, stress_from_strain_grad, LocalProblem,
};
use crate::{EvalError, EvalOptions, EvalResult, OutputData, RankTimings, MIN_DISTANCE};
use ddmlip_atoms::System;
use ddmlip_engine::{Buffers, Graph, Model, ModelOutputs, RowDomain, Scalar};
use ddmlip_neighbors::{pair_list_for_centers_into, NeighborOptions, PairList, PairScratch};
use ddmlip_spec::OutputKind;
use std::time::Instant;

/// Single process: the whole batch on one graph.
pub(crate) fn evaluate_single<T: Scalar>(
    model: &dyn Model,
    batch: &[System],
    opts: &EvalOptions,
    buffers: &mut Buffers<T>,
    scratch: &mut PairScratch,
) -> Result<EvalResult, EvalError> {
    let mut clock = Instant::now();
    let mut timings = RankTimings::default();
    let mut g = Graph::<T>::with_buffers(std::mem::take(buffers));
    if opts.trace {
        g.enable_trace();
    }
    if opts.check_finite {
        g.enable_finite_checks();
    }
    place_on_device(&mut g, opts)?;
    let n_sys = batch.len();
    let problem = batch_problem(&mut g, model, batch, opts, scratch)?;
    let built = build_inputs(&mut g, problem, model.uses_runtime_graph())?;
    let (pos, eps, inputs) = (built.positions, built.strain, built.inputs);
    timings.setup = lap(&mut clock);
    if opts.profile {
        g.enable_profile();
    }
    let out = model.forward_any(&mut g, &inputs)?;
    check_energy_shape(&g, out.energy, n_sys)?;
    timings.forward = lap(&mut clock);
    let grads = g.grad(out.energy, None, &[pos, eps])?;
    outputs_to_host(&mut g, &out)?;
    timings.backward = lap(&mut clock);
    let mut result = collect_outputs(&g, &out, &grads, batch);
    result.diagnostics.handler_counts = g.handler_counts().clone();
    if let Some(tr) = g.take_trace() {
        result.diagnostics.traces.push(tr);
    }
    result.diagnostics.profiles.extend(g.take_profile());
    timings.gather = lap(&mut clock);
    result.diagnostics.rank_timings = vec![timings];
    *buffers = g.into_buffers();
    Ok(result)
}

/// The whole batch as one problem in batch rows: every system's atoms, cell
/// and (for a model that reads the runtime graph) its periodic pair list,
/// shifted to batch rows. Rejects atoms closer than [`MIN_DISTANCE`].
fn batch_problem<T: Scalar>(
    g: &mut Graph<T>,
    model: &dyn Model,
    batch: &[System],
    opts: &EvalOptions,
    scratch: &mut PairScratch,
) -> Result<LocalProblem, EvalError> {
    let mut positions = Vec::new();
    let mut numbers = Vec::new();
    let mut atom_system = Vec::new();
    let mut cells = Vec::new();
    // Pair lists and per-edge indices live in the graph's recycled memory.
    let (mut centers, mut neighbors) = (g.take_indices(), g.take_indices());
    let (mut shifts, mut edge_sys) = (g.take_shifts(), g.take_indices());
    let mut pairs = PairList::default();
    let mut offset = 0u32;
    for (s, sys) in batch.iter().enumerate() {
        positions.extend(sys.positions.iter().flatten());
        numbers.extend_from_slice(&sys.numbers);
        atom_system.extend(std::iter::repeat_n(s as u32, sys.len()));
        let cell = sys.cell_or_zero();
        cells.extend(cell.matrix.iter().flatten());
        let cutoff = if model.uses_runtime_graph() {
            model.cutoff()
        } else {
            MIN_DISTANCE * 2.0
        };
        if batch.len() == 1 {
            pairs.centers = std::mem::take(&mut centers);
            pairs.neighbors = std::mem::take(&mut neighbors);
            pairs.shifts = std::mem::take(&mut shifts);
        }
        pair_list_for_centers_into(
            &sys.positions,
            sys.cell.as_ref(),
            sys.pbc,
            &NeighborOptions {
                cutoff,
                half: false,
            },
            sys.len(),
            scratch,
            &mut pairs,
        )
        .map_err(|e| EvalError::Input(format!("frame {s}: {e}")))?;
        if !opts.allow_close_atoms {
            if let Some((e, d)) = pairs.closest.filter(|&(_, d)| d < MIN_DISTANCE) {
                return Err(close_atoms_error(
                    s,
                    pairs.centers[e] as usize,
                    pairs.neighbors[e] as usize,
                    d,
                ));
            }
        }
        if model.uses_runtime_graph() {
            let n_pairs = pairs.len();
            let mut pair_shifts = std::mem::take(&mut pairs.shifts);
            if pair_shifts.is_empty() {
                pair_shifts.resize(n_pairs, [0; 3]);
            }
            if batch.len() == 1 {
                // One system: the list is already in batch rows.
                centers = std::mem::take(&mut pairs.centers);
                neighbors = std::mem::take(&mut pairs.neighbors);
                shifts = pair_shifts;
            } else {
                centers.extend(pairs.centers.iter().map(|&c| c + offset));
                neighbors.extend(pairs.neighbors.iter().map(|&c| c + offset));
                shifts.extend_from_slice(&pair_shifts);
            }
            edge_sys.extend(std::iter::repeat_n(s as u32, n_pairs));
        }
        offset += sys.len() as u32;
    }
    // Lists a model without a runtime graph did not take go back for reuse.
    for spare in [pairs.centers, pairs.neighbors] {
        g.give_indices(spare);
    }
    Ok(LocalProblem {
        positions,
        numbers,
        atom_system,
        cells,
        pbc: batch.iter().map(|s| s.pbc).collect(),
        centers,
        neighbors,
        edge_system: edge_sys,
        shifts: Some(shifts),
    })
}

/// Energy, forces, stress, atomic energies and the model's extra outputs
/// of a single-process run, as f64.
fn collect_outputs<T: Scalar>(
    g: &Graph<T>,
    out: &ModelOutputs,
    grads: &[Vec<T>],
    batch: &[System],
) -> EvalResult {
    let mut result = EvalResult {
        has_stress: batch.iter().map(has_stress).collect(),
        ..Default::default()
    };
    let to64 = |v: &[T]| v.iter().map(|x| x.to_f64_lossless()).collect::<Vec<f64>>();
    result.outputs.insert(
        "energy".into(),
        OutputData {
            kind: OutputKind::PerSystem,
            width: 1,
            values: to64(g.value(out.energy)),
        },
    );
    result.outputs.insert(
        "forces".into(),
        OutputData {
            kind: OutputKind::PerAtom,
            width: 3,
            values: grads[0].iter().map(|x| -x.to_f64_lossless()).collect(),
        },
    );
    let geps = to64(&grads[1]);
    result.outputs.insert(
        "stress".into(),
        OutputData {
            kind: OutputKind::PerSystem,
            width: 6,
            values: stress_from_strain_grad(&geps, batch),
        },
    );
    if let Some(ae) = out.atomic_energies {
        result.outputs.insert(
            "atomic_energies".into(),
            OutputData {
                kind: OutputKind::PerAtom,
                width: 1,
                values: to64(g.value(ae)),
            },
        );
    }
    for (name, t) in &out.extra {
        let cols = g.shape(*t).1;
        let kind = match g.domain(*t) {
            RowDomain::Atom => OutputKind::PerAtom,
            RowDomain::System => OutputKind::PerSystem,
            _ => OutputKind::Global,
        };
        result.outputs.insert(
            name.clone(),
            OutputData {
                kind,
                width: cols,
                values: to64(g.value(*t)),
            },
        );
    }
    result
}
