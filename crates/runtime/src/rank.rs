//! One rank of a decomposed evaluation: its memory, its run (retried with
//! eager sums when the model reads one during its forward pass), and the
//! entry point for ranks that are separate processes.

use crate::consolidate::{gather_shares, panic_message, RankShare};
use crate::inputs::{
    build_inputs, check_batch, check_energy_shape, close_atoms_error, lap, outputs_to_host,
    place_on_device, LocalProblem,
};
use crate::split::{plan_split, Layout, Split};
use crate::{EvalError, EvalOptions, EvalResult, RankTimings, MIN_DISTANCE, NEIGHBOR_COUNTS};
use ddmlip_atoms::System;
use ddmlip_comm::Communicator;
use ddmlip_domain::{HaloRuntime, RankDomain};
use ddmlip_engine::{
    Buffers, DType, EngineError, Graph, Model, ModelOutputs, RowDomain, Scalar, Tensor, Trace,
};
use ddmlip_neighbors::{
    pair_list_for_centers_into, ChunkRunner, NeighborOptions, PairList, PairScratch,
};
use ddmlip_spec::MLIPSpec;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// What one rank hands back to the caller.
#[derive(Debug)]
pub struct RankResult {
    /// Consolidated outputs (rank 0 only).
    pub result: Option<EvalResult>,
    /// This rank's trace, when requested.
    pub trace: Option<Trace>,
    /// This rank's op times, when requested ([`EvalOptions::profile`]).
    pub profile: Option<ddmlip_engine::OpProfile>,
    /// This rank's handler firings.
    pub handler_counts: BTreeMap<String, usize>,
    /// Bytes this rank sent.
    pub bytes_sent: u64,
    /// (owned rows, ghost rows, edges) of this rank.
    pub sizes: (usize, usize, usize),
    /// Where this rank's time went.
    pub timings: RankTimings,
    /// This rank's outputs, when the caller assembles them (threads backend).
    pub(crate) share: Option<RankShare>,
}

/// One rank's tensor memory, kept between evaluations.
#[derive(Default)]
pub(crate) struct RankBuffers {
    pub(crate) f32: Buffers<f32>,
    pub(crate) f64: Buffers<f64>,
    pub(crate) pairs: PairScratch,
    /// The model reads a per-system sum during its forward pass, so its
    /// all-reduces cannot be deferred (learned on the first call).
    eager_sums: bool,
    /// The rank's private worker pool and its size, kept between calls so
    /// that its threads (and their allocator arenas and warm caches) are
    /// not created and torn down on every step.
    pub(crate) pool: Option<(usize, rayon::ThreadPool)>,
}

impl RankBuffers {
    /// Takes this rank's private pool of `threads` workers out (to be put
    /// back after the call), building it on first use or when the size
    /// changed; `None` when the system refuses another thread.
    pub(crate) fn take_pool(
        &mut self,
        rank: usize,
        threads: usize,
    ) -> Option<(usize, rayon::ThreadPool)> {
        match self.pool.take() {
            Some(kept) if kept.0 == threads => Some(kept),
            _ => rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |k| format!("rank{rank}-worker{k}"))
                .build()
                .ok()
                .map(|pool| (threads, pool)),
        }
    }

    /// [`run_rank`] in the precision `opts.dtype` asks for, with this rank's
    /// memory.
    pub(crate) fn run_rank(
        &mut self,
        model: &dyn Model,
        batch: &[System],
        split: &Split,
        comm: Box<dyn Communicator>,
        opts: &EvalOptions,
    ) -> Result<RankResult, EvalError> {
        match opts.dtype {
            DType::F64 => run_rank(
                model,
                batch,
                split,
                comm,
                opts,
                (&mut self.f64, &mut self.pairs, &mut self.eager_sums),
            ),
            DType::F32 => run_rank(
                model,
                batch,
                split,
                comm,
                opts,
                (&mut self.f32, &mut self.pairs, &mut self.eager_sums),
            ),
        }
    }
}

/// Runs this process's rank of a decomposed evaluation over an external
/// communicator (one MPI process per rank). Every rank must call it with the
/// same batch and options; rank 0's [`RankResult::result`] holds the outputs.
pub fn evaluate_on_communicator(
    model: &dyn Model,
    batch: &[System],
    opts: &EvalOptions,
    comm: Box<dyn Communicator>,
) -> Result<RankResult, EvalError> {
    // On a pool worker (MPI is started `Serialized`: any one thread may call it).
    ddmlip_engine::on_pool_worker(|| evaluate_this_rank(model, batch, opts, comm))
}

/// [`evaluate_on_communicator`]'s body.
fn evaluate_this_rank(
    model: &dyn Model,
    batch: &[System],
    opts: &EvalOptions,
    comm: Box<dyn Communicator>,
) -> Result<RankResult, EvalError> {
    let started = Instant::now();
    let ranks = comm.size();
    let prepared = check_batch(model, batch)
        .and_then(|_| plan_split(model, batch, opts, ranks, (started, true)));
    let split = match prepared {
        Ok(p) => p,
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e);
        }
    };
    let mut r = RankBuffers::default().run_rank(model, batch, &split, comm, opts)?;
    if let Some(res) = r.result.as_mut() {
        res.diagnostics.partition_s = split.partition_s;
        res.diagnostics.partitions = split.parts;
    }
    Ok(r)
}

/// One rank's whole run. Any failure aborts the communicator first so that
/// no peer waits for this rank.
fn run_rank<T: Scalar>(
    model: &dyn Model,
    batch: &[System],
    split: &Split,
    comm: Box<dyn Communicator>,
    opts: &EvalOptions,
    (buffers, pairs, eager_sums): (&mut Buffers<T>, &mut PairScratch, &mut bool),
) -> Result<RankResult, EvalError> {
    let start = split.started.elapsed().as_secs_f64();
    let clock = Instant::now();
    let rank = comm.rank();
    let plan = split.layout.plan(&split.parts, rank);
    let mut dist: Box<dyn ddmlip_engine::Distributor> =
        Box::new(HaloRuntime::new(comm, plan, split.spec.clone()));
    loop {
        let mut g = Graph::<T>::with_buffers(std::mem::take(buffers));
        g.set_distributor(dist);
        // Per-system sums complete when first needed (for the energy: after
        // the backward pass, with the force exchange), unless this model
        // reads them during its forward pass.
        g.defer_all_reduces(!*eager_sums);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rank_body::<T>(
                &mut g,
                model,
                batch,
                split,
                rank,
                opts,
                pairs,
                (start, clock),
            )
        }));
        // A panic is the model's (or this code's) failure on this rank, not
        // bad input: it becomes a failed rank below.
        let panicked = outcome.is_err();
        let outcome = match outcome {
            Ok(r) => r,
            Err(p) => Err(EvalError::Input(panic_message(&*p))),
        };
        return match outcome {
            // Every rank records the same ops, so every rank lands here at
            // the same op, with no exchange left half done.
            Err(EvalError::Engine(EngineError::DeferredSumRead { .. })) if !*eager_sums => {
                *eager_sums = true;
                dist = g
                    .take_distributor()
                    .ok_or_else(|| EvalError::Input("distributor missing".into()))?;
                *buffers = g.into_buffers();
                continue;
            }
            Ok(mut r) => {
                let released = Instant::now();
                *buffers = g.into_buffers();
                r.timings.release = released.elapsed().as_secs_f64();
                Ok(r)
            }
            Err(e) => {
                let message = e.to_string();
                // A peer's failure is not this rank's to re-announce.
                if let Some(d) = g.distributor() {
                    d.abort(&message);
                }
                Err(match e {
                    EvalError::Engine(EngineError::Comm { .. }) => e,
                    // Bad input (close atoms, an element the model lacks) is
                    // bad input whichever rank finds it, as in one process.
                    EvalError::Input(_) | EvalError::Engine(EngineError::Input(_)) if !panicked => {
                        e
                    }
                    other => EvalError::RankFailed {
                        rank,
                        message: other.to_string(),
                    },
                })
            }
        };
    }
}

/// One rank's evaluation on its graph: local rows and pairs, forward,
/// backward, the force reverse-sum and the sums over ranks, then its share of
/// the outputs (gathered to rank 0 when ranks are processes).
#[allow(clippy::too_many_arguments)]
fn rank_body<T: Scalar>(
    g: &mut Graph<T>,
    model: &dyn Model,
    batch: &[System],
    split: &Split,
    rank: usize,
    opts: &EvalOptions,
    scratch: &mut PairScratch,
    (start, mut clock): (f64, Instant),
) -> Result<RankResult, EvalError> {
    let layout = &split.layout;
    let mut timings = RankTimings {
        start,
        ..Default::default()
    };
    if opts.trace {
        g.enable_trace();
    }
    if opts.check_finite {
        g.enable_finite_checks();
    }
    place_on_device(g, opts)?;
    let n_sys = batch.len();
    let (n_owned, n_local) = (layout.n_owned[rank], layout.n_local[rank]);
    let (problem, globals) = rank_problem(g, model, batch, split, rank, opts, scratch)?;
    let n_edges = problem.centers.len();
    let mut owned_counts = vec![0.0f64; n_owned];
    // Edges come grouped by centre: one addition per run of equal centres,
    // not a dependent read-modify-write per edge.
    for run in problem.centers.chunk_by(|a, b| a == b) {
        owned_counts[run[0] as usize] += run.len() as f64;
    }
    let built = build_inputs(g, problem, model.uses_runtime_graph())?;
    let (pos, eps, inputs) = (built.positions, built.strain, built.inputs);
    timings.setup = lap(&mut clock);
    if opts.profile {
        g.enable_profile();
    }
    let out = model.forward_any(g, &inputs)?;
    check_energy_shape(g, out.energy, n_sys)?;
    timings.forward = lap(&mut clock);
    timings.forward_comm = g.distributor().map_or(0.0, |d| d.comm_seconds());
    let (gpos, geps) = rank_gradients(g, out.energy, rank, n_sys, [pos, eps])?;
    outputs_to_host(g, &out)?;
    timings.backward = lap(&mut clock);
    let profile = g.take_profile();
    timings.backward_comm =
        g.distributor().map_or(0.0, |d| d.comm_seconds()) - timings.forward_comm;
    let counts = model.uses_runtime_graph().then_some(owned_counts);
    let mut share = rank_share(
        g,
        &split.spec,
        &out,
        (gpos, geps),
        counts,
        (n_owned, n_local),
    )?;
    share.globals = globals;
    timings.reduce = lap(&mut clock);
    let handler_counts = g.handler_counts().clone();
    let trace = g.take_trace();
    let runtime = g
        .take_distributor()
        .and_then(|d| d.into_any().downcast::<HaloRuntime>().ok())
        .ok_or_else(|| EvalError::Input("distributor missing".into()))?;
    timings.comm = runtime.comm_s;
    let comm = runtime.comm;
    let sizes = (n_owned, n_local - n_owned, n_edges);
    // The halo traffic of the step, without the result gather.
    let bytes_sent = comm.stats().bytes_sent;
    let (result, share) = if split.gather_to_root {
        let mut result = gather_shares(comm.as_ref(), batch, share)?;
        // Process ranks: rank 0's result carries rank 0's profile.
        if let (Some(r), Some(p)) = (result.as_mut(), &profile) {
            r.diagnostics.profiles.push(p.clone());
        }
        (result, None)
    } else {
        // Ranks of one process hand their share to the caller, which
        // assembles after joining them: no exchange, no copy per rank.
        (None, Some(share))
    };
    timings.gather = lap(&mut clock);
    Ok(RankResult {
        result,
        trace,
        profile,
        handler_counts,
        bytes_sent,
        sizes,
        timings,
        share,
    })
}

/// This rank's problem in local rows — owned atoms of every system (wrapped
/// into the cell), then their ghost images — with the pairs centred on owned
/// atoms, and the batch-level atom id of each owned row. Rejects atoms
/// closer than [`MIN_DISTANCE`].
fn rank_problem<T: Scalar>(
    g: &mut Graph<T>,
    model: &dyn Model,
    batch: &[System],
    split: &Split,
    rank: usize,
    opts: &EvalOptions,
    scratch: &mut PairScratch,
) -> Result<(LocalProblem, Vec<u64>), EvalError> {
    let (parts, layout) = (&split.parts, &split.layout);
    let n_sys = batch.len();
    let (n_owned, n_local) = (layout.n_owned[rank], layout.n_local[rank]);
    let mut arrays = RankRows {
        positions: vec![0.0; n_local * 3],
        numbers: vec![0u32; n_local],
        atom_system: vec![0u32; n_local],
        globals: vec![0u64; n_owned],
    };
    let mut cells = Vec::with_capacity(9 * n_sys);
    // Pair lists and per-edge indices live in the graph's recycled memory.
    let (mut centers, mut neighbors) = (g.take_indices(), g.take_indices());
    let mut edge_sys = g.take_indices();
    let mut pairs = PairList::default();
    // With a board, ranks that wait may take chunks of this rank's search.
    scratch.set_chunk_runner(ddmlip_engine::helpers::has_board().then(|| -> ChunkRunner {
        Arc::new(|n, f| ddmlip_engine::helpers::run_pieces_or_par(n, f))
    }));
    for (s, (sys, part)) in batch.iter().zip(parts).enumerate() {
        let dom = &part.ranks[rank];
        cells.extend(sys.cell_or_zero().matrix.iter().flatten());
        let (local_pos, rows) = arrays.add_system(sys, dom, layout, rank, s);
        let cutoff = if model.uses_runtime_graph() {
            model.cutoff()
        } else {
            MIN_DISTANCE * 2.0
        };
        // Only owned atoms centre edges; their neighbours may be ghosts.
        let n_owned_s = dom.owned.len() as u32;
        if batch.len() == 1 {
            pairs.centers = std::mem::take(&mut centers);
            pairs.neighbors = std::mem::take(&mut neighbors);
        }
        pair_list_for_centers_into(
            &local_pos,
            None,
            [false; 3],
            &NeighborOptions {
                cutoff,
                half: false,
            },
            n_owned_s as usize,
            scratch,
            &mut pairs,
        )
        .map_err(|e| EvalError::Input(format!("frame {s}: {e}")))?;
        if !opts.allow_close_atoms {
            reject_close_pair(&pairs, dom, s)?;
        }
        if model.uses_runtime_graph() {
            edge_sys.extend(std::iter::repeat_n(s as u32, pairs.len()));
            if batch.len() == 1 {
                // One system: local list order is row order already.
                centers = std::mem::take(&mut pairs.centers);
                neighbors = std::mem::take(&mut pairs.neighbors);
            } else {
                centers.extend(pairs.centers.iter().map(|&c| rows[c as usize] as u32));
                neighbors.extend(pairs.neighbors.iter().map(|&c| rows[c as usize] as u32));
            }
        }
    }
    // Lists a model without a runtime graph did not take go back for reuse.
    for spare in [pairs.centers, pairs.neighbors] {
        g.give_indices(spare);
    }
    let problem = LocalProblem {
        positions: arrays.positions,
        numbers: arrays.numbers,
        atom_system: arrays.atom_system,
        cells,
        // Ghost images are explicit atoms: no periodicity left to apply.
        pbc: vec![[false; 3]; n_sys],
        centers,
        neighbors,
        edge_system: edge_sys,
        shifts: None,
    };
    Ok((problem, arrays.globals))
}

/// Fails when the closest pair of `pairs` (local rows of system `s` on the
/// rank holding `dom`) is nearer than [`MIN_DISTANCE`], naming both atoms
/// by their index in the system.
fn reject_close_pair(pairs: &PairList, dom: &RankDomain, s: usize) -> Result<(), EvalError> {
    let Some((e, d)) = pairs.closest.filter(|&(_, d)| d < MIN_DISTANCE) else {
        return Ok(());
    };
    let n_owned = dom.owned.len() as u32;
    let system_index = |row: u32| -> usize {
        if row < n_owned {
            dom.owned[row as usize]
        } else {
            dom.ghosts[(row - n_owned) as usize].global
        }
    };
    Err(close_atoms_error(
        s,
        system_index(pairs.centers[e]),
        system_index(pairs.neighbors[e]),
        d,
    ))
}

/// A rank's per-row arrays, filled system by system.
struct RankRows {
    /// Local rows × 3 (Å): owned positions wrapped and ghost images placed
    /// in f64 (the graph rounds them once).
    positions: Vec<f64>,
    numbers: Vec<u32>,
    /// Row → system.
    atom_system: Vec<u32>,
    /// Batch-level atom id of each owned row.
    globals: Vec<u64>,
}

impl RankRows {
    /// Places system `s`'s owned atoms (wrapped into the cell, in the same
    /// frame as the ghosts) and ghost images in their local rows. Returns the
    /// system's local positions (owned, then ghosts) and the row of each.
    fn add_system(
        &mut self,
        sys: &System,
        dom: &RankDomain,
        layout: &Layout,
        rank: usize,
        s: usize,
    ) -> (Vec<[f64; 3]>, Vec<usize>) {
        let cell = sys.cell_or_zero();
        let mut local_pos: Vec<[f64; 3]> = Vec::with_capacity(dom.owned.len() + dom.ghosts.len());
        let mut rows: Vec<usize> = Vec::with_capacity(local_pos.capacity());
        for (k, &j) in dom.owned.iter().enumerate() {
            let row = layout.owned_offset[rank][s] + k;
            let sv = cell.shift_vector(dom.owned_shifts[k]);
            let p = sys.positions[j];
            local_pos.push([p[0] + sv[0], p[1] + sv[1], p[2] + sv[2]]);
            rows.push(row);
            self.numbers[row] = sys.numbers[j];
            self.atom_system[row] = s as u32;
            self.globals[row] = (layout.atom_offset[s] + j) as u64;
        }
        for (k, gh) in dom.ghosts.iter().enumerate() {
            let row = layout.ghost_offset[rank][s] + k;
            let sv = cell.shift_vector(gh.shift);
            let p = sys.positions[gh.global];
            local_pos.push([p[0] + sv[0], p[1] + sv[1], p[2] + sv[2]]);
            rows.push(row);
            self.numbers[row] = sys.numbers[gh.global];
            self.atom_system[row] = s as u32;
        }
        for (p, &row) in local_pos.iter().zip(&rows) {
            self.positions[row * 3..row * 3 + 3].copy_from_slice(p);
        }
        (local_pos, rows)
    }
}

/// ∂E/∂r (local rows × 3) and ∂E/∂ε (systems × 9) of the global energy on
/// this rank, before the ghost rows' reverse-sum.
fn rank_gradients<T: Scalar>(
    g: &mut Graph<T>,
    energy: Tensor,
    rank: usize,
    n_sys: usize,
    leaves: [Tensor; 2],
) -> Result<(Vec<T>, Vec<T>), EvalError> {
    let grads = if g.is_pending(energy) {
        // The energy's all-reduce is still pending: every rank seeds its
        // partial with ones, and the sum completes after the force exchange
        // below, so ranks meet once per step instead of twice.
        g.grad_replicated_seed(energy, Some(vec![T::one(); n_sys]), &leaves)?
    } else {
        // A replicated energy is the same number on every rank: seed it once
        // so that the all-reduce adjoints do not count it world_size times.
        let seed: Vec<T> = if g.is_replicated(energy) && rank != 0 {
            vec![T::zero(); n_sys]
        } else {
            vec![T::one(); n_sys]
        };
        g.grad(energy, Some(seed), &leaves)?
    };
    Ok((grads[0].clone(), grads[1].clone()))
}

/// The rank's outputs after the force reverse-sum and the sums over ranks
/// the spec asks for: owned rows of every per-atom output, and the
/// per-system outputs. `globals` is left for the caller to fill.
/// `neighbor_counts` (owned rows) has one entry per owned atom.
fn rank_share<T: Scalar>(
    g: &mut Graph<T>,
    spec: &MLIPSpec,
    out: &ModelOutputs,
    (mut gpos, mut geps): (Vec<T>, Vec<T>),
    neighbor_counts: Option<Vec<f64>>,
    (n_owned, n_local): (usize, usize),
) -> Result<RankShare, EvalError> {
    let missing = || EvalError::Input("distributor missing".into());
    // Ghost positions are images of owned ones: their force share goes home.
    g.distributor()
        .ok_or_else(missing)?
        .reverse_sum(T::data_mut(&mut gpos), 3)?;
    g.resolve_pending()?;
    let mut energy = g.value(out.energy).to_vec();
    let reduced = |name: &str| spec.all_reduce_outputs.iter().any(|o| o == name);
    if reduced("stress") {
        let dist = g.distributor().ok_or_else(missing)?;
        dist.all_reduce_sum(T::data_mut(&mut geps))?;
    }
    if reduced("energy") {
        let dist = g.distributor().ok_or_else(missing)?;
        dist.all_reduce_sum(T::data_mut(&mut energy))?;
    }
    let to64 = |v: &[T]| v.iter().map(|x| x.to_f64_lossless()).collect::<Vec<f64>>();
    // Per-atom outputs: owned rows, tagged with batch-level atom ids.
    let mut per_atom: Vec<(String, usize, Vec<f64>)> = vec![(
        "forces".into(),
        3,
        gpos[..n_owned * 3]
            .iter()
            .map(|x| -x.to_f64_lossless())
            .collect(),
    )];
    if let Some(ae) = out.atomic_energies {
        per_atom.push(("atomic_energies".into(), 1, to64(&g.value(ae)[..n_owned])));
    }
    if let Some(counts) = neighbor_counts {
        per_atom.push((NEIGHBOR_COUNTS.into(), 1, counts));
    }
    let mut per_system: Vec<(String, usize, Vec<f64>)> = vec![("energy".into(), 1, to64(&energy))];
    for (name, t) in &out.extra {
        let (rows, cols) = g.shape(*t);
        let mut v = g.value(*t).to_vec();
        match g.domain(*t) {
            RowDomain::Atom if rows == n_local => {
                per_atom.push((name.clone(), cols, to64(&v[..n_owned * cols])))
            }
            _ => {
                if reduced(name) {
                    let dist = g.distributor().ok_or_else(missing)?;
                    dist.all_reduce_sum(T::data_mut(&mut v))?;
                }
                per_system.push((name.clone(), cols, to64(&v)));
            }
        }
    }
    Ok(RankShare {
        globals: Vec::new(),
        per_atom,
        per_system,
        strain_grad: to64(&geps),
    })
}
