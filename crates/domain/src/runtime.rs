//! Running a model on a batch: in one process, or split over ranks with
//! halo exchange, and consolidating the outputs per global atom id.

use crate::halo::{HaloRuntime, LocalHaloPlan};
use crate::partition::{partition_system_balanced, Balance, Partition};
use ddmlip_atoms::{Cell, System};
use ddmlip_comm::{thread_world, Communicator, IdleWork, ThreadsConfig};
use ddmlip_engine::helpers::{with_board, HelpBoard};
use ddmlip_engine::ops::PeriodicShifts;
use ddmlip_engine::{
    Buffers, DType, EngineError, Graph, Model, ModelInputs, RowDomain, Scalar, Trace,
};
use ddmlip_neighbors::{
    pair_list_for_centers_into, ChunkRunner, NeighborOptions, PairList, PairScratch,
};
use ddmlip_spec::{MLIPSpec, OutputKind};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Errors of a model evaluation.
#[derive(Debug, Error, Clone)]
pub enum EvalError {
    /// The input cannot be evaluated (empty system, unsupported element, …).
    #[error("{0}")]
    Input(String),
    /// The model or an op failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A rank failed; every other rank was released.
    #[error("rank {rank} failed: {message}")]
    RankFailed { rank: usize, message: String },
}

/// How to run an evaluation.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub dtype: DType,
    /// 1 runs in this process without decomposition.
    pub ranks: usize,
    /// The spec for decomposed runs; `None` uses the model's declared one
    /// (or the standard energy-model spec).
    pub spec: Option<MLIPSpec>,
    /// Record traces of every rank.
    pub trace: bool,
    /// Fail on the first op that produces NaN/inf, naming it.
    pub check_finite: bool,
    /// Extra ghost width beyond `halo_depth × cutoff` (Å).
    pub skin: f64,
    /// Deadline of every blocking communication call.
    pub timeout: Duration,
    /// Run even when atoms are closer than [`MIN_DISTANCE`] (tests only).
    pub allow_close_atoms: bool,
    /// Threads of each rank's own worker pool in a decomposed threads-backend
    /// run; 0 picks the available cores / ranks (at least 1). Private pools
    /// keep a rank's parallel work on its own cores, as separate processes
    /// would. Single-process runs use the caller's rayon pool.
    pub threads_per_rank: usize,
    /// How domain boundaries are placed in a decomposed run.
    pub balance: BalancePolicy,
    /// Threads backend: ranks waiting for a message run pieces of the ops
    /// of ranks still working (`ddmlip_engine::helpers`). Results are the
    /// same bits whoever runs a piece.
    pub work_sharing: bool,
}

/// How a decomposed run places its domain boundaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BalancePolicy {
    /// A regular grid in fractional coordinates.
    #[default]
    Geometric,
    /// Staggered cuts giving every rank about the same number of atoms:
    /// slabs along the first split axis, columns within each slab, boxes
    /// within each column. Evens out slabs, clusters and other uneven
    /// systems; atoms that share a coordinate (a lattice plane) stay on one
    /// side of a cut, so counts are as even as the planes allow.
    Atoms,
}

impl BalancePolicy {
    /// The partitioner's setting for this policy.
    pub fn partition_balance(self) -> Balance<'static> {
        match self {
            Self::Geometric => Balance::Geometric,
            Self::Atoms => Balance::EvenCounts,
        }
    }
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F64,
            ranks: 1,
            spec: None,
            trace: false,
            check_finite: false,
            skin: 0.0,
            timeout: Duration::from_secs(120),
            allow_close_atoms: false,
            threads_per_rank: 0,
            balance: BalancePolicy::Geometric,
            work_sharing: true,
        }
    }
}

/// Most ranks the threads backend starts (one OS thread each).
pub const MAX_THREAD_RANKS: usize = 1024;

/// Atoms closer than this (Å) are rejected: most potentials diverge there.
pub const MIN_DISTANCE: f64 = 1e-6;

/// Internal per-atom output: how many runtime-graph edges each atom centres
/// (the halo-completeness evidence). Names starting with `_` are diagnostics.
pub const NEIGHBOR_COUNTS: &str = "_neighbor_counts";

/// One output of a run: rows are atoms (batch order) or systems.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputData {
    pub kind: OutputKind,
    /// Values per row.
    pub width: usize,
    /// rows × width, row-major.
    pub values: Vec<f64>,
}

/// Results of an evaluation, consolidated over ranks.
#[derive(Debug, Clone, Default)]
pub struct EvalResult {
    /// Every output by name: `energy`, `forces`, `stress` (periodic systems;
    /// NaN rows otherwise), `atomic_energies`, and model-specific extras.
    pub outputs: BTreeMap<String, OutputData>,
    /// Which systems have a stress (periodic, with a cell).
    pub has_stress: Vec<bool>,
    /// Traces per rank (one entry for a single-process run) when requested.
    pub traces: Vec<Trace>,
    /// Distributed handler firings, summed over ranks.
    pub handler_counts: BTreeMap<String, usize>,
    /// The partition of each system (decomposed runs).
    pub partitions: Vec<Partition>,
    /// Bytes sent by all ranks.
    pub bytes_sent: u64,
    /// Per rank: (owned, ghost) local rows and edges.
    pub rank_sizes: Vec<(usize, usize, usize)>,
    /// Wall-clock seconds spent computing the partitions and halo layout
    /// before any rank started (decomposed runs).
    pub partition_s: f64,
    /// Per rank: where its wall-clock time went (one entry for a
    /// single-process run).
    pub rank_timings: Vec<RankTimings>,
    /// Seconds from the start of the call until the consolidated result was
    /// ready (decomposed runs): after the last rank's end, joining the ranks
    /// and assembling the result.
    pub finish_s: f64,
}

/// Where one rank's wall-clock time went, in seconds. `start` is measured
/// from the beginning of the evaluation call; the phases follow each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankTimings {
    /// When the rank began, after the partition (s since the call started).
    pub start: f64,
    /// Local rows, halo plan, neighbour search and graph inputs.
    pub setup: f64,
    /// The model's forward pass (halo exchanges included).
    pub forward: f64,
    /// The backward pass for forces and stress (halo exchanges included).
    pub backward: f64,
    /// Reverse-sum of ghost forces and all-reduces of per-system outputs.
    pub reduce: f64,
    /// Handing the outputs over: the gather to rank 0 and the assembly there
    /// when ranks are processes; next to nothing for ranks of one process,
    /// whose outputs the caller assembles after joining them (in `finish_s`).
    pub gather: f64,
    /// Part of forward + backward + reduce spent inside communication calls
    /// (waiting for peers included).
    pub comm: f64,
    /// Part of `comm` spent during the forward pass.
    pub forward_comm: f64,
    /// Part of `comm` spent during the backward pass.
    #[serde(default)]
    pub backward_comm: f64,
    /// Handing the graph's memory back for the next call, after `gather`.
    pub release: f64,
}

impl RankTimings {
    /// The rank's own work (s): setup, forward and backward without the
    /// time spent in communication calls.
    pub fn work(&self) -> f64 {
        self.setup + self.forward - self.forward_comm + self.backward - self.backward_comm
    }

    /// When the rank finished (s since the call started).
    pub fn end(&self) -> f64 {
        self.start + self.setup + self.forward + self.backward + self.reduce + self.gather
    }
}

impl EvalResult {
    /// Energy per system (eV).
    pub fn energy(&self) -> &[f64] {
        self.outputs
            .get("energy")
            .map(|o| o.values.as_slice())
            .unwrap_or(&[])
    }

    /// Forces per atom (eV/Å), batch order.
    pub fn forces(&self) -> Vec<[f64; 3]> {
        self.outputs
            .get("forces")
            .map(|o| o.values.chunks(3).map(|c| [c[0], c[1], c[2]]).collect())
            .unwrap_or_default()
    }

    /// Stress per system (eV/Å³, Voigt xx yy zz yz xz xy), `None` for non-periodic systems.
    pub fn stress(&self) -> Vec<Option<[f64; 6]>> {
        let Some(o) = self.outputs.get("stress") else {
            return vec![];
        };
        o.values
            .chunks(6)
            .zip(&self.has_stress)
            .map(|(c, &has)| has.then(|| [c[0], c[1], c[2], c[3], c[4], c[5]]))
            .collect()
    }

    /// Per-atom energies (eV), when the model has them.
    pub fn atomic_energies(&self) -> Option<&[f64]> {
        self.outputs
            .get("atomic_energies")
            .map(|o| o.values.as_slice())
    }
}

/// Checks the batch against the model before any work.
pub fn check_batch(model: &dyn Model, batch: &[System]) -> Result<(), EvalError> {
    if batch.is_empty() {
        return Err(EvalError::Input(
            "the structure file holds no frames".into(),
        ));
    }
    let support = model.species();
    for (s, sys) in batch.iter().enumerate() {
        if sys.is_empty() {
            return Err(EvalError::Input(format!("frame {s} has no atoms")));
        }
        sys.validate()
            .map_err(|e| EvalError::Input(format!("frame {s}: {e}")))?;
        let mut bad: Vec<u32> = sys
            .numbers
            .iter()
            .copied()
            .filter(|&z| !support.contains(z))
            .collect();
        bad.sort_unstable();
        bad.dedup();
        if !bad.is_empty() {
            let names: Vec<String> = bad
                .iter()
                .map(|&z| match ddmlip_atoms::elements::symbol(z) {
                    Some(sym) => format!("{sym} (Z={z})"),
                    None => format!("Z={z}"),
                })
                .collect();
            return Err(EvalError::Input(format!(
                "frame {s}: model `{}` has no parameters for {}",
                model.name(),
                names.join(", ")
            )));
        }
    }
    Ok(())
}

fn has_stress(sys: &System) -> bool {
    sys.is_periodic() && sys.cell.is_some_and(|c| c.volume() > 1e-12)
}

/// Runs the model and returns every output, forces and stress included.
/// For repeated evaluations (MD steps, benchmarks) keep an [`Evaluator`],
/// which reuses each rank's memory between calls.
pub fn evaluate(
    model: &dyn Model,
    batch: &[System],
    opts: &EvalOptions,
) -> Result<EvalResult, EvalError> {
    Evaluator::new(model, opts.clone()).evaluate(batch)
}

/// One rank's tensor memory, kept between evaluations.
#[derive(Default)]
struct RankBuffers {
    f32: Buffers<f32>,
    f64: Buffers<f64>,
    pairs: PairScratch,
    /// The model reads a per-system sum during its forward pass, so its
    /// all-reduces cannot be deferred (learned on the first call).
    eager_sums: bool,
    /// The rank's private worker pool and its size, kept between calls so
    /// that its threads (and their allocator arenas and warm caches) are
    /// not created and torn down on every step.
    pool: Option<(usize, rayon::ThreadPool)>,
}

impl RankBuffers {
    /// Takes this rank's private pool of `threads` workers out (to be put
    /// back after the call), building it on first use or when the size
    /// changed; `None` when the system refuses another thread.
    fn take_pool(&mut self, rank: usize, threads: usize) -> Option<(usize, rayon::ThreadPool)> {
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
    fn run_rank(
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

/// Evaluates one model with fixed options again and again, keeping every
/// rank's tensor memory from one call to the next: after the first call a
/// step faults in no fresh pages, which is what lets many ranks share one
/// machine. The memory held is about the peak of the last call
/// ([`Evaluator::held_bytes`]); drop the evaluator to return it.
pub struct Evaluator<'m> {
    model: &'m dyn Model,
    opts: EvalOptions,
    /// One entry per rank (index = rank).
    buffers: Vec<RankBuffers>,
}

impl<'m> Evaluator<'m> {
    /// An evaluator of `model` under `opts`; nothing is checked or allocated
    /// until the first [`Evaluator::evaluate`].
    pub fn new(model: &'m dyn Model, opts: EvalOptions) -> Self {
        Self {
            model,
            opts,
            buffers: Vec::new(),
        }
    }

    /// The options every call uses.
    pub fn options(&self) -> &EvalOptions {
        &self.opts
    }

    /// Large tensors that could not reuse kept memory, over all calls and
    /// ranks so far (see [`Buffers::fresh_allocations`]).
    pub fn fresh_allocations(&self) -> usize {
        self.buffers
            .iter()
            .map(|b| b.f32.fresh_allocations() + b.f64.fresh_allocations())
            .sum()
    }

    /// Bytes of tensor memory kept for the next call, over all ranks.
    pub fn held_bytes(&self) -> usize {
        self.buffers
            .iter()
            .map(|b| b.f32.bytes() + b.f64.bytes())
            .sum()
    }

    /// Runs the model on `batch`: see [`evaluate`].
    pub fn evaluate(&mut self, batch: &[System]) -> Result<EvalResult, EvalError> {
        let (model, opts) = (self.model, &self.opts);
        check_batch(model, batch)?;
        if opts.ranks == 0 {
            return Err(EvalError::Input("--ranks must be at least 1".into()));
        }
        if opts.ranks > MAX_THREAD_RANKS {
            return Err(EvalError::Input(format!(
                "--ranks {} is more than the threads backend runs ({MAX_THREAD_RANKS}: one OS thread per rank); use the MPI backend for more",
                opts.ranks
            )));
        }
        // One rank without a spec is the plain single-process run.
        let single = opts.ranks == 1 && opts.spec.is_none();
        self.buffers
            .resize_with(if single { 1 } else { opts.ranks }, RankBuffers::default);
        if single {
            let held = &mut self.buffers[0];
            return match opts.dtype {
                DType::F64 => evaluate_single(model, batch, opts, &mut held.f64, &mut held.pairs),
                DType::F32 => evaluate_single(model, batch, opts, &mut held.f32, &mut held.pairs),
            };
        }
        evaluate_threads(model, batch, opts, &mut self.buffers)
    }
}

fn close_atoms_error(sys: usize, i: usize, j: usize, d: f64) -> EvalError {
    EvalError::Input(format!(
        "frame {sys}: atoms {i} and {j} are {d:.2e} Å apart (less than {MIN_DISTANCE:e} Å); the model cannot be evaluated there"
    ))
}

/// Single process: the whole batch on one graph.
fn evaluate_single<T: Scalar>(
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
    let n_sys = batch.len();
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
        positions.extend(
            sys.positions
                .iter()
                .flat_map(|p| p.iter().map(|&x| T::of(x))),
        );
        numbers.extend_from_slice(&sys.numbers);
        atom_system.extend(std::iter::repeat_n(s as u32, sys.len()));
        let cell = sys.cell_or_zero();
        cells.extend(cell.matrix.iter().flatten().map(|&x| T::of(x)));
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
    let built = build_inputs(
        &mut g,
        LocalProblem {
            positions,
            numbers,
            atom_system,
            cells,
            pbc: batch.iter().map(|s| s.pbc).collect(),
            centers,
            neighbors,
            edge_system: edge_sys,
            shifts: Some(shifts),
        },
        model.uses_runtime_graph(),
    )?;
    let (pos, eps, inputs) = (built.positions, built.strain, built.inputs);
    timings.setup = lap(&mut clock);
    let out = model.forward_any(&mut g, &inputs)?;
    check_energy_shape(&g, out.energy, n_sys)?;
    timings.forward = lap(&mut clock);
    let grads = g.grad(out.energy, None, &[pos, eps])?;
    timings.backward = lap(&mut clock);
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
        let (rows, cols) = g.shape(*t);
        let kind = match g.domain(*t) {
            RowDomain::Atom => OutputKind::PerAtom,
            RowDomain::System => OutputKind::PerSystem,
            _ => OutputKind::Global,
        };
        let _ = rows;
        result.outputs.insert(
            name.clone(),
            OutputData {
                kind,
                width: cols,
                values: to64(g.value(*t)),
            },
        );
    }
    result.handler_counts = g.handler_counts().clone();
    if let Some(tr) = g.take_trace() {
        result.traces.push(tr);
    }
    timings.gather = lap(&mut clock);
    result.rank_timings = vec![timings];
    *buffers = g.into_buffers();
    Ok(result)
}

fn check_energy_shape<T: Scalar>(
    g: &Graph<T>,
    energy: ddmlip_engine::Tensor,
    n_sys: usize,
) -> Result<(), EvalError> {
    if g.shape(energy) != (n_sys, 1) {
        return Err(EvalError::Engine(EngineError::Shape {
            op: "model output".into(),
            message: format!(
                "energy must be {n_sys}×1 (one row per system), got {:?}",
                g.shape(energy)
            ),
        }));
    }
    Ok(())
}

/// What one process evaluates, as plain arrays: its atom rows, the cells, and
/// the runtime graph (edge endpoints are row numbers).
struct LocalProblem<T> {
    /// rows × 3 (Å).
    positions: Vec<T>,
    numbers: Vec<u32>,
    /// Row → system.
    atom_system: Vec<u32>,
    /// n_systems × 9, rows of each cell are lattice vectors.
    cells: Vec<T>,
    pbc: Vec<[bool; 3]>,
    centers: Vec<u32>,
    neighbors: Vec<u32>,
    edge_system: Vec<u32>,
    /// Integer image shifts per edge, or `None` when images are explicit atoms.
    shifts: Option<Vec<[i32; 3]>>,
}

/// The differentiable leaves and what the model receives.
struct BuiltInputs {
    positions: ddmlip_engine::Tensor,
    strain: ddmlip_engine::Tensor,
    inputs: ModelInputs,
}

/// Puts a problem on the graph: position and strain leaves, strained
/// positions and cells, and (when the model wants it) the runtime graph
/// with edge vectors and lengths.
fn build_inputs<T: Scalar>(
    g: &mut Graph<T>,
    p: LocalProblem<T>,
    with_graph: bool,
) -> Result<BuiltInputs, EvalError> {
    let n_rows = p.numbers.len();
    let n_sys = p.pbc.len();
    let positions = g.leaf(p.positions, n_rows, 3, RowDomain::Atom);
    let strain = g.leaf(vec![T::zero(); 9 * n_sys], n_sys, 9, RowDomain::System);
    let cell = g.constant(p.cells, 3 * n_sys, 3, RowDomain::System);
    let atom_system = g.index(
        Arc::new(p.atom_system),
        RowDomain::Atom,
        RowDomain::System,
        n_sys,
        "atom_system",
    )?;
    let cell_rows: Vec<u32> = (0..3 * n_sys as u32).map(|r| r / 3).collect();
    let cell_system = g.index(
        Arc::new(cell_rows),
        RowDomain::System,
        RowDomain::System,
        n_sys,
        "cell_system",
    )?;
    let pos_s = g.apply_strain(positions, strain, atom_system)?;
    let cell_s = g.apply_strain(cell, strain, cell_system)?;
    let edges = if with_graph {
        let c = g.index(
            Arc::new(p.centers),
            RowDomain::Edge,
            RowDomain::Atom,
            n_rows,
            "edge_center",
        )?;
        let n = g.index(
            Arc::new(p.neighbors),
            RowDomain::Edge,
            RowDomain::Atom,
            n_rows,
            "edge_neighbor",
        )?;
        let es = g.index(
            Arc::new(p.edge_system),
            RowDomain::Edge,
            RowDomain::System,
            n_sys,
            "edge_system",
        )?;
        let periodic = p.shifts.map(|shifts| PeriodicShifts {
            cell: cell_s,
            shifts: Arc::new(shifts),
            edge_system: es,
        });
        Some(g.edges(pos_s, c, n, es, periodic)?)
    } else {
        None
    };
    let inputs = ModelInputs {
        positions: pos_s,
        cell: cell_s,
        numbers: Arc::new(p.numbers),
        atom_system,
        n_systems: n_sys,
        pbc: p.pbc,
        edges,
    };
    Ok(BuiltInputs {
        positions,
        strain,
        inputs,
    })
}

/// σ = (1/V)·sym(∂E/∂ε) in ASE Voigt order (xx yy zz yz xz xy); NaN rows for
/// systems without a stress.
fn stress_from_strain_grad(geps: &[f64], batch: &[System]) -> Vec<f64> {
    let mut out = Vec::with_capacity(6 * batch.len());
    for (s, sys) in batch.iter().enumerate() {
        if !has_stress(sys) {
            out.extend([f64::NAN; 6]);
            continue;
        }
        let v = sys.cell.map(|c: Cell| c.volume()).unwrap_or(1.0);
        let e = &geps[s * 9..s * 9 + 9];
        let sym = |a: usize, b: usize| 0.5 * (e[a * 3 + b] + e[b * 3 + a]) / v;
        out.extend([
            sym(0, 0),
            sym(1, 1),
            sym(2, 2),
            sym(1, 2),
            sym(0, 2),
            sym(0, 1),
        ]);
    }
    out
}

/// Where each system's rows live on each rank.
struct Layout {
    /// [rank][system] → first owned local row.
    owned_offset: Vec<Vec<usize>>,
    /// [rank][system] → first ghost local row.
    ghost_offset: Vec<Vec<usize>>,
    n_owned: Vec<usize>,
    n_local: Vec<usize>,
    /// First batch-level atom id of each system.
    atom_offset: Vec<usize>,
}

impl Layout {
    fn new(parts: &[Partition], batch: &[System], ranks: usize) -> Self {
        let mut owned_offset = vec![vec![0; parts.len()]; ranks];
        let mut ghost_offset = vec![vec![0; parts.len()]; ranks];
        let mut n_owned = vec![0; ranks];
        let mut n_local = vec![0; ranks];
        for r in 0..ranks {
            let mut o = 0;
            for (s, p) in parts.iter().enumerate() {
                owned_offset[r][s] = o;
                o += p.ranks[r].owned.len();
            }
            let mut gh = o;
            for (s, p) in parts.iter().enumerate() {
                ghost_offset[r][s] = gh;
                gh += p.ranks[r].ghosts.len();
            }
            n_owned[r] = o;
            n_local[r] = gh;
        }
        let mut atom_offset = Vec::with_capacity(batch.len());
        let mut acc = 0;
        for sys in batch {
            atom_offset.push(acc);
            acc += sys.len();
        }
        Self {
            owned_offset,
            ghost_offset,
            n_owned,
            n_local,
            atom_offset,
        }
    }

    /// The halo plan of `rank` in local rows.
    fn plan(&self, parts: &[Partition], rank: usize) -> LocalHaloPlan {
        let ranks = self.n_owned.len();
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for peer in 0..ranks {
            let mut rows = Vec::new();
            for (s, p) in parts.iter().enumerate() {
                for gh in &p.ranks[peer].ghosts {
                    if gh.owner_rank == rank {
                        rows.push((self.owned_offset[rank][s] + gh.owner_row) as u32);
                    }
                }
            }
            if !rows.is_empty() {
                sends.push((peer, rows));
            }
            let mut rows = Vec::new();
            for (s, p) in parts.iter().enumerate() {
                for (k, gh) in p.ranks[rank].ghosts.iter().enumerate() {
                    if gh.owner_rank == peer {
                        rows.push((self.ghost_offset[rank][s] + k) as u32);
                    }
                }
            }
            if !rows.is_empty() {
                recvs.push((peer, rows));
            }
        }
        LocalHaloPlan {
            n_owned: self.n_owned[rank],
            n_local: self.n_local[rank],
            sends,
            recvs,
        }
    }
}

/// What one rank hands back to the caller.
#[derive(Debug)]
pub struct RankResult {
    /// Consolidated outputs (rank 0 only).
    pub result: Option<EvalResult>,
    /// This rank's trace, when requested.
    pub trace: Option<Trace>,
    /// This rank's handler firings.
    pub handler_counts: BTreeMap<String, usize>,
    /// Bytes this rank sent.
    pub bytes_sent: u64,
    /// (owned rows, ghost rows, edges) of this rank.
    pub sizes: (usize, usize, usize),
    /// Where this rank's time went.
    pub timings: RankTimings,
    /// This rank's outputs, when the caller assembles them (threads backend).
    share: Option<RankShare>,
}

/// The spec a decomposed run follows, the partition of every system over
/// `ranks` and the row layout (the same on every rank: a pure function of
/// the input). `started` is when the evaluation call began.
fn plan_split(
    model: &dyn Model,
    batch: &[System],
    opts: &EvalOptions,
    ranks: usize,
    (started, gather_to_root): (Instant, bool),
) -> Result<Split, EvalError> {
    let spec = effective_spec(model, opts);
    let width = ghost_width(model, &spec, opts.skin);
    let balance = opts.balance.partition_balance();
    let parts = batch
        .iter()
        .enumerate()
        .map(|(s, sys)| {
            partition_system_balanced(sys, ranks, width, balance)
                .map_err(|e| EvalError::Input(format!("frame {s}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let layout = Layout::new(&parts, batch, ranks);
    Ok(Split {
        partition_s: started.elapsed().as_secs_f64(),
        parts,
        layout,
        spec,
        started,
        gather_to_root,
    })
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
        res.partition_s = split.partition_s;
        res.partitions = split.parts;
    }
    Ok(r)
}

/// The spec a decomposed run follows.
pub fn effective_spec(model: &dyn Model, opts: &EvalOptions) -> MLIPSpec {
    opts.spec
        .clone()
        .or_else(|| model.declared_spec())
        .unwrap_or_else(MLIPSpec::standard_energy_model)
}

/// Ghost width for a model under a spec (Å).
pub fn ghost_width(model: &dyn Model, spec: &MLIPSpec, skin: f64) -> f64 {
    model.cutoff() * spec.halo_depth.max(1) as f64 + skin
}

fn evaluate_threads(
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
    result.partition_s = split.partition_s;
    result.finish_s = split.started.elapsed().as_secs_f64();
    Ok(result)
}

/// Assembles the threads ranks' shares into one result, or returns the
/// root-cause failure.
fn combine_rank_results(
    outcomes: Vec<Result<RankResult, EvalError>>,
    batch: &[System],
    parts: Vec<Partition>,
) -> Result<EvalResult, EvalError> {
    // A rank's own error comes first; a peer's `PeerFailed` only echoes it.
    let errors: Vec<&EvalError> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    let first_err = errors
        .iter()
        .find(|e| matches!(e, EvalError::RankFailed { .. }))
        .or_else(|| errors.first())
        .map(|e| (*e).clone());
    if let Some(e) = first_err {
        return Err(e);
    }
    let mut shares = Vec::with_capacity(outcomes.len());
    let mut traces = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut bytes = 0;
    let mut sizes = Vec::new();
    let mut timings = Vec::new();
    for r in outcomes.into_iter().flatten() {
        shares.extend(r.share);
        traces.extend(r.trace);
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
    result.traces = traces;
    result.handler_counts = counts;
    result.bytes_sent = bytes;
    result.rank_sizes = sizes;
    result.rank_timings = timings;
    result.partitions = parts;
    Ok(result)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "panic".to_string()
    }
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
                    other => EvalError::RankFailed {
                        rank,
                        message: other.to_string(),
                    },
                })
            }
        };
    }
}

/// What every rank of one decomposed evaluation shares.
struct Split {
    parts: Vec<Partition>,
    layout: Layout,
    spec: MLIPSpec,
    /// When the evaluation call began (rank timings are relative to it).
    started: Instant,
    /// Seconds spent computing `parts` and `layout`.
    partition_s: f64,
    /// Ranks are separate processes: rank 0 gathers every rank's outputs.
    /// Otherwise each rank returns its share to the caller.
    gather_to_root: bool,
}

/// Seconds since `clock`, restarting it.
fn lap(clock: &mut Instant) -> f64 {
    let now = Instant::now();
    let s = (now - *clock).as_secs_f64();
    *clock = now;
    s
}

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
    let (parts, layout, spec) = (&split.parts, &split.layout, &split.spec);
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
    let n_sys = batch.len();
    let (n_owned, n_local) = (layout.n_owned[rank], layout.n_local[rank]);
    let mut positions = vec![T::zero(); n_local * 3];
    let mut numbers = vec![0u32; n_local];
    let mut atom_system = vec![0u32; n_local];
    let mut globals = vec![0u64; n_owned];
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
        let cell = sys.cell_or_zero();
        cells.extend(cell.matrix.iter().flatten().map(|&x| T::of(x)));
        // Local atoms of this system: owned, then ghost images.
        let mut local_pos: Vec<[f64; 3]> = Vec::with_capacity(dom.owned.len() + dom.ghosts.len());
        let mut rows: Vec<usize> = Vec::with_capacity(local_pos.capacity());
        for (k, &j) in dom.owned.iter().enumerate() {
            let row = layout.owned_offset[rank][s] + k;
            // Owned atoms sit wrapped into the cell, in the same frame as the ghosts.
            let sv = cell.shift_vector(dom.owned_shifts[k]);
            let p = sys.positions[j];
            local_pos.push([p[0] + sv[0], p[1] + sv[1], p[2] + sv[2]]);
            rows.push(row);
            numbers[row] = sys.numbers[j];
            atom_system[row] = s as u32;
            globals[row] = (layout.atom_offset[s] + j) as u64;
        }
        for (k, gh) in dom.ghosts.iter().enumerate() {
            let row = layout.ghost_offset[rank][s] + k;
            let sv = cell.shift_vector(gh.shift);
            let p = sys.positions[gh.global];
            local_pos.push([p[0] + sv[0], p[1] + sv[1], p[2] + sv[2]]);
            rows.push(row);
            numbers[row] = sys.numbers[gh.global];
            atom_system[row] = s as u32;
        }
        for (p, &row) in local_pos.iter().zip(&rows) {
            for k in 0..3 {
                positions[row * 3 + k] = T::of(p[k]);
            }
        }
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
            if let Some((e, d)) = pairs.closest.filter(|&(_, d)| d < MIN_DISTANCE) {
                let gid = |t: u32| -> usize {
                    if t < n_owned_s {
                        dom.owned[t as usize]
                    } else {
                        dom.ghosts[(t - n_owned_s) as usize].global
                    }
                };
                return Err(close_atoms_error(
                    s,
                    gid(pairs.centers[e]),
                    gid(pairs.neighbors[e]),
                    d,
                ));
            }
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
    let n_edges = centers.len();
    let mut owned_counts = vec![0.0f64; n_owned];
    // Edges come grouped by centre: one addition per run of equal centres,
    // not a dependent read-modify-write per edge.
    for run in centers.chunk_by(|a, b| a == b) {
        owned_counts[run[0] as usize] += run.len() as f64;
    }
    let built = build_inputs(
        g,
        LocalProblem {
            positions,
            numbers,
            atom_system,
            cells,
            // Ghost images are explicit atoms: no periodicity left to apply.
            pbc: vec![[false; 3]; n_sys],
            centers,
            neighbors,
            edge_system: edge_sys,
            shifts: None,
        },
        model.uses_runtime_graph(),
    )?;
    let (pos, eps, inputs) = (built.positions, built.strain, built.inputs);
    timings.setup = lap(&mut clock);
    let out = model.forward_any(g, &inputs)?;
    check_energy_shape(g, out.energy, n_sys)?;
    timings.forward = lap(&mut clock);
    timings.forward_comm = g.distributor().map_or(0.0, |d| d.comm_seconds());
    let grads = if g.is_pending(out.energy) {
        // The energy's all-reduce is still pending: every rank seeds its
        // partial with ones, and the sum completes after the force exchange
        // below, so ranks meet once per step instead of twice.
        g.grad_replicated_seed(out.energy, Some(vec![T::one(); n_sys]), &[pos, eps])?
    } else {
        // A replicated energy is the same number on every rank: seed it once
        // so that the all-reduce adjoints do not count it world_size times.
        let seed: Vec<T> = if g.is_replicated(out.energy) && rank != 0 {
            vec![T::zero(); n_sys]
        } else {
            vec![T::one(); n_sys]
        };
        g.grad(out.energy, Some(seed), &[pos, eps])?
    };
    timings.backward = lap(&mut clock);
    timings.backward_comm =
        g.distributor().map_or(0.0, |d| d.comm_seconds()) - timings.forward_comm;
    let mut gpos = grads[0].clone();
    let mut geps = grads[1].clone();
    // Ghost positions are images of owned ones: their force share goes home.
    g.distributor()
        .ok_or_else(|| EvalError::Input("distributor missing".into()))?
        .reverse_sum(T::data_mut(&mut gpos), 3)?;
    g.resolve_pending()?;
    let mut energy = g.value(out.energy).to_vec();
    let dist = g
        .distributor()
        .ok_or_else(|| EvalError::Input("distributor missing".into()))?;
    if spec.all_reduce_outputs.iter().any(|o| o == "stress") {
        dist.all_reduce_sum(T::data_mut(&mut geps))?;
    }
    if spec.all_reduce_outputs.iter().any(|o| o == "energy") {
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
    if model.uses_runtime_graph() {
        per_atom.push((NEIGHBOR_COUNTS.into(), 1, owned_counts));
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
                if spec.all_reduce_outputs.iter().any(|o| o == name) {
                    let dist = g
                        .distributor()
                        .ok_or_else(|| EvalError::Input("distributor missing".into()))?;
                    dist.all_reduce_sum(T::data_mut(&mut v))?;
                }
                per_system.push((name.clone(), cols, to64(&v)));
            }
        }
    }
    timings.reduce = lap(&mut clock);
    let handler_counts = g.handler_counts().clone();
    let trace = g.take_trace();
    let runtime = g
        .take_distributor()
        .and_then(|d| d.into_any().downcast::<HaloRuntime>().ok())
        .ok_or_else(|| EvalError::Input("distributor missing".into()))?;
    timings.comm = runtime.comm_s;
    let comm = runtime.comm;
    let share = RankShare {
        globals,
        per_atom,
        per_system,
        strain_grad: to64(&geps),
    };
    let sizes = (n_owned, n_local - n_owned, n_edges);
    // The halo traffic of the step, without the result gather.
    let bytes_sent = comm.stats().bytes_sent;
    let (result, share) = if split.gather_to_root {
        (gather_shares(comm.as_ref(), batch, share)?, None)
    } else {
        // Ranks of one process hand their share to the caller, which
        // assembles after joining them: no exchange, no copy per rank.
        (None, Some(share))
    };
    timings.gather = lap(&mut clock);
    Ok(RankResult {
        result,
        trace,
        handler_counts,
        bytes_sent,
        sizes,
        timings,
        share,
    })
}

/// One rank's part of the outputs before consolidation: its owned rows of
/// every per-atom output, tagged with batch-level atom ids, and the
/// per-system outputs (already summed over ranks, the same on every rank).
#[derive(Debug)]
struct RankShare {
    /// Batch-level atom id of each owned row.
    globals: Vec<u64>,
    /// (name, width, owned rows × width).
    per_atom: Vec<(String, usize, Vec<f64>)>,
    /// (name, width, systems × width).
    per_system: Vec<(String, usize, Vec<f64>)>,
    /// ∂E/∂ε per system (9 each), summed over ranks.
    strain_grad: Vec<f64>,
}

/// Collects every rank's owned rows over `comm` (an all-gather: the
/// communicator has no rooted gather) and assembles the result on rank 0
/// (`None` on the other ranks).
fn gather_shares(
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
