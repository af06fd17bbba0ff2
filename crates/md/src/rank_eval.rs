//! Evaluating a model on one rank's persistent local rows: owned atoms first,
//! then ghost images, with a candidate pair list built with a skin.
//!
//! This is the rank-level entry point the MD driver needs: unlike
//! `ddmlip_runtime::evaluate`, which partitions a whole batch on every
//! call, it takes the rows, the halo plan and the pairs a rank keeps between
//! steps. Per call it keeps only the candidate pairs closer than the model's
//! cutoff, so a model sees exactly the pairs a fresh neighbour search would
//! give it, whatever it does beyond its cutoff.

use crate::phases::{lap, EvalPhases};
use crate::state::RankState;
use crate::MdError;
use ddmlip_atoms::Cell;
use ddmlip_domain::HaloRuntime;
use ddmlip_engine::device::{open_backend, DeviceBackend, EngineDevice};
use ddmlip_engine::{Buffers, DType, EngineError, Graph, Model, ModelInputs, RowDomain, Scalar};
use ddmlip_spec::MLIPSpec;
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

/// One rank's local rows as the model sees them.
pub struct LocalRows<'a> {
    /// Owned positions then ghost positions (Å); ghosts are explicit images.
    pub positions: &'a [[f64; 3]],
    /// Atomic numbers of the same rows.
    pub numbers: &'a [u32],
    /// How many leading rows are owned.
    pub n_owned: usize,
    /// Candidate pairs (centre row, neighbour row), centres owned, listed
    /// with cutoff + skin; the evaluation keeps those closer than the cutoff.
    pub centers: &'a [u32],
    /// Neighbour rows of the candidate pairs, one per entry of `centers`.
    pub neighbors: &'a [u32],
    /// The system's cell (zero for a non-periodic system): the volume of the
    /// stress and the model's `cell` input.
    pub cell: Cell,
}

/// What one evaluation gives a rank.
#[derive(Debug, Clone)]
pub struct RankForces {
    /// The system's potential energy (eV), the same on every rank (this
    /// rank's share while `energy_partial`).
    pub energy: f64,
    /// Forces on the owned rows (eV/Å). Empty when
    /// [`RankEvaluator::evaluate_state`] made it: the forces are then in the
    /// state's `forces`, whose memory is reused from step to step.
    pub forces: Vec<[f64; 3]>,
    /// ∂E/∂ε of the whole system (eV, row-major 3×3), the same on every rank
    /// (this rank's share while `strain_partial`);
    /// the stress is its symmetric part over the volume.
    pub strain_gradient: [f64; 9],
    /// Pairs within the cutoff this rank evaluated.
    pub pairs: usize,
    /// `energy` is still this rank's share: the caller sums it over ranks
    /// (see [`RankEvaluator::defer_global_sums`]).
    pub energy_partial: bool,
    /// `strain_gradient` is still this rank's share: the caller sums it over
    /// ranks.
    pub strain_partial: bool,
}

/// A model evaluator that keeps one rank's tensor memory between steps.
pub struct RankEvaluator<'m> {
    model: &'m dyn Model,
    spec: MLIPSpec,
    dtype: DType,
    f64_buffers: Buffers<f64>,
    f32_buffers: Buffers<f32>,
    /// The model reads a per-system sum during its forward pass, so its
    /// all-reduces cannot be deferred (learned on the first call).
    eager_sums: bool,
    /// Leave the energy and strain-gradient sums over ranks to the caller.
    defer_sums: bool,
    /// The model's atomic numbers, shared with every graph while the rows'
    /// numbers stay the same (they change only when the rows are rebuilt).
    numbers: Arc<Vec<u32>>,
    /// Where the force calls since the last reset spent their time.
    phases: EvalPhases,
    /// Zeros, one per edge of the last call: every edge's system.
    edge_system: Arc<Vec<u32>>,
    /// Where the graph's device-eligible ops run, and the backend opened
    /// there for this evaluator (kept across steps: one stream per rank).
    device: Option<EngineDevice>,
    backend: Option<Box<dyn Any + Send + Sync>>,
}

impl<'m> RankEvaluator<'m> {
    /// An evaluator of `model` following `spec` in precision `dtype`.
    pub fn new(model: &'m dyn Model, spec: MLIPSpec, dtype: DType) -> Self {
        Self {
            model,
            spec,
            dtype,
            f64_buffers: Buffers::default(),
            f32_buffers: Buffers::default(),
            eager_sums: false,
            defer_sums: false,
            numbers: Arc::default(),
            phases: EvalPhases::default(),
            edge_system: Arc::default(),
            device: None,
            backend: None,
        }
    }

    /// Seconds spent in each part of the force calls since the last
    /// [`RankEvaluator::reset_phases`] (or since the evaluator was made).
    pub fn phases(&self) -> EvalPhases {
        self.phases
    }

    /// Starts the phase sums of [`RankEvaluator::phases`] afresh.
    pub fn reset_phases(&mut self) {
        self.phases = EvalPhases::default();
    }

    /// With `on`, an evaluation no longer sums the energy and the strain
    /// gradient over ranks itself: [`RankForces`] then holds this rank's
    /// shares, flagged by `energy_partial` / `strain_partial`, and the caller
    /// folds them into a reduction it makes anyway (the MD step's one
    /// collective). A model that reads its per-system sums during the
    /// forward pass still has them summed there; then the flag is off.
    /// Every rank must make the same choice.
    pub fn defer_global_sums(&mut self, on: bool) {
        self.defer_sums = on;
    }

    /// The spec decomposed evaluations follow.
    pub fn spec(&self) -> &MLIPSpec {
        &self.spec
    }

    /// The model.
    pub fn model(&self) -> &'m dyn Model {
        self.model
    }

    /// Evaluates `state`'s local rows and stores the owned forces in
    /// `state.forces` (the returned [`RankForces`] holds the totals and an
    /// empty `forces`). Collective, as [`RankEvaluator::evaluate`]. A step
    /// that evaluates the same rows again (a steady MD step) allocates no
    /// per-atom or per-edge array: the graph's tensors, its position leaf
    /// and gradient come from the memory the last call used, and the forces
    /// overwrite `state.forces` in place.
    pub fn evaluate_state(&mut self, state: &mut RankState) -> Result<RankForces, MdError> {
        let rows = LocalRows {
            positions: &state.positions,
            numbers: &state.numbers,
            n_owned: state.n_owned(),
            centers: &state.centers,
            neighbors: &state.neighbors,
            cell: state.cell,
        };
        self.evaluate_into(&rows, &mut state.halo, &mut state.forces)
    }

    /// Evaluates energy, owned forces and the strain gradient. Collective:
    /// every rank of `runtime`'s communicator calls it in the same step. The
    /// runtime (communicator + halo plan) is lent to the graph for the call
    /// and handed back.
    pub fn evaluate(
        &mut self,
        rows: &LocalRows<'_>,
        runtime: &mut Option<HaloRuntime>,
    ) -> Result<RankForces, MdError> {
        let mut forces = Vec::new();
        let mut out = self.evaluate_into(rows, runtime, &mut forces)?;
        out.forces = forces;
        Ok(out)
    }

    /// [`RankEvaluator::evaluate`] with the owned forces written into
    /// `forces` (resized to the owned rows, its memory reused).
    fn evaluate_into(
        &mut self,
        rows: &LocalRows<'_>,
        runtime: &mut Option<HaloRuntime>,
        forces: &mut Vec<[f64; 3]>,
    ) -> Result<RankForces, MdError> {
        if self.numbers.as_slice() != rows.numbers {
            self.numbers = Arc::new(rows.numbers.to_vec());
        }
        match self.dtype {
            DType::F64 => {
                let mut buffers = std::mem::take(&mut self.f64_buffers);
                let out = self.evaluate_typed::<f64>(rows, runtime, &mut buffers, forces);
                self.f64_buffers = buffers;
                out
            }
            DType::F32 => {
                let mut buffers = std::mem::take(&mut self.f32_buffers);
                let out = self.evaluate_typed::<f32>(rows, runtime, &mut buffers, forces);
                self.f32_buffers = buffers;
                out
            }
        }
    }

    /// Runs the op engine's device-eligible ops on `device` from the next
    /// call on (`None`: the host).
    pub fn set_device(&mut self, device: Option<EngineDevice>) {
        self.device = device;
        self.backend = None;
    }

    /// This evaluator's backend on its device, opened on first use.
    fn device_backend<T: Scalar>(&mut self) -> Result<Option<Arc<dyn DeviceBackend<T>>>, MdError> {
        let Some(device) = &self.device else {
            return Ok(None);
        };
        if let Some(b) = self
            .backend
            .as_ref()
            .and_then(|b| b.downcast_ref::<Arc<dyn DeviceBackend<T>>>())
        {
            return Ok(Some(Arc::clone(b)));
        }
        let opened = open_backend::<T>(device.0.as_ref()).map_err(|e| {
            MdError::Engine(EngineError::Device {
                op: format!("opening {}", device.0.name()),
                message: e.0,
            })
        })?;
        self.backend = Some(Box::new(Arc::clone(&opened)));
        Ok(Some(opened))
    }

    fn evaluate_typed<T: Scalar>(
        &mut self,
        rows: &LocalRows<'_>,
        runtime: &mut Option<HaloRuntime>,
        buffers: &mut Buffers<T>,
        forces: &mut Vec<[f64; 3]>,
    ) -> Result<RankForces, MdError> {
        // Opened before the halo runtime is lent out: a failure here
        // leaves it with the caller.
        let device = self.device_backend::<T>()?;
        loop {
            let halo = runtime
                .take()
                .ok_or_else(|| MdError::Internal("the rank's halo runtime is missing".into()))?;
            let mut g = Graph::<T>::with_buffers(std::mem::take(buffers));
            if let Some(backend) = device.clone() {
                g.set_device(backend);
            }
            g.set_distributor(Box::new(halo));
            g.defer_all_reduces(!self.eager_sums);
            let outcome = self.body(&mut g, rows, forces);
            let halo = g
                .take_distributor()
                .and_then(|d| d.into_any().downcast::<HaloRuntime>().ok())
                .map(|b| *b);
            *buffers = g.into_buffers();
            *runtime = halo;
            match outcome {
                // Every rank records the same ops, so every rank lands here at
                // the same op, with no exchange half done.
                Err(MdError::Engine(EngineError::DeferredSumRead { .. })) if !self.eager_sums => {
                    self.eager_sums = true;
                    continue;
                }
                Err(e) => {
                    if let Some(h) = runtime.as_ref() {
                        if !matches!(e, MdError::Engine(EngineError::Comm { .. })) {
                            h.comm.abort(&e.to_string());
                        }
                    }
                    return Err(e);
                }
                Ok(r) => return Ok(r),
            }
        }
    }

    fn body<T: Scalar>(
        &mut self,
        g: &mut Graph<T>,
        rows: &LocalRows<'_>,
        forces: &mut Vec<[f64; 3]>,
    ) -> Result<RankForces, MdError> {
        let mut clock = Instant::now();
        let model = self.model;
        let n_local = rows.positions.len();
        let n_owned = rows.n_owned;
        let with_graph = model.uses_runtime_graph();
        // The two per-edge index arrays take the largest recycled ones
        // (`take_indices` hands out the largest first), the per-atom one after.
        let mut centers = g.take_indices();
        let mut neighbors = g.take_indices();
        if with_graph {
            keep_within_cutoff(rows, model.cutoff(), &mut centers, &mut neighbors);
        }
        let n_pairs = centers.len();
        self.phases.filter += lap(&mut clock);
        let mut positions = g.take_values(n_local * 3);
        for (dst, src) in positions.iter_mut().zip(rows.positions.iter().flatten()) {
            *dst = T::from_f64(*src);
        }
        let pos = g.leaf(positions, n_local, 3, RowDomain::Atom);
        let strain = g.leaf(vec![T::zero(); 9], 1, 9, RowDomain::System);
        let cell_values: Vec<T> = rows
            .cell
            .matrix
            .iter()
            .flatten()
            .map(|&x| T::from_f64(x))
            .collect();
        let cell = g.constant(cell_values, 3, 3, RowDomain::System);
        if T::DTYPE != DType::F64 {
            // Edge geometry from the f64 rows (ghosts placed in f64), rounded
            // once, not from the rounded positions.
            g.set_exact_values(pos, rows.positions.iter().flatten().copied().collect())?;
            g.set_exact_values(cell, rows.cell.matrix.iter().flatten().copied().collect())?;
        }
        let mut atom_rows = g.take_indices();
        atom_rows.resize(n_local, 0);
        let atom_system = g.index(
            Arc::new(atom_rows),
            RowDomain::Atom,
            RowDomain::System,
            1,
            "atom_system",
        )?;
        let cell_system = g.index(
            Arc::new(vec![0u32; 3]),
            RowDomain::System,
            RowDomain::System,
            1,
            "cell_system",
        )?;
        let pos_s = g.apply_strain(pos, strain, atom_system)?;
        let cell_s = g.apply_strain(cell, strain, cell_system)?;
        let edges = if with_graph {
            // Every edge is in system 0: the evaluator's own array of
            // zeros, which the graph hands back unshared when it ends, so
            // a step writes only the zeros its pair count grew by.
            Arc::make_mut(&mut self.edge_system).resize(n_pairs, 0);
            let c = g.index(
                Arc::new(centers),
                RowDomain::Edge,
                RowDomain::Atom,
                n_local,
                "edge_center",
            )?;
            let n = g.index(
                Arc::new(neighbors),
                RowDomain::Edge,
                RowDomain::Atom,
                n_local,
                "edge_neighbor",
            )?;
            let es = g.index(
                Arc::clone(&self.edge_system),
                RowDomain::Edge,
                RowDomain::System,
                1,
                "edge_system",
            )?;
            Some(g.edges(pos_s, c, n, es, None)?)
        } else {
            g.give_indices(centers);
            g.give_indices(neighbors);
            None
        };
        let inputs = ModelInputs {
            positions: pos_s,
            cell: cell_s,
            numbers: Arc::clone(&self.numbers),
            atom_system,
            n_systems: 1,
            // Ghost images are explicit atoms: no periodicity left to apply.
            pbc: vec![[false; 3]],
            edges,
        };
        let out = model.forward_any(g, &inputs)?;
        if g.shape(out.energy) != (1, 1) {
            return Err(MdError::Engine(EngineError::Shape {
                op: "model output".into(),
                message: format!("energy must be 1×1, got {:?}", g.shape(out.energy)),
            }));
        }
        self.phases.forward += lap(&mut clock);
        let rank = g.distributor().map_or(0, |d| d.rank());
        let grads = if g.is_pending(out.energy) {
            g.grad_replicated_seed(out.energy, Some(vec![T::one()]), &[pos, strain])?
        } else {
            // A replicated energy is seeded once so that the all-reduce
            // adjoints do not count it world-size times.
            let seed = if g.is_replicated(out.energy) && rank != 0 {
                T::zero()
            } else {
                T::one()
            };
            g.grad(out.energy, Some(vec![seed]), &[pos, strain])?
        };
        self.phases.backward += lap(&mut clock);
        let mut grads = grads.into_iter();
        let (Some(mut gpos), Some(mut geps)) = (grads.next(), grads.next()) else {
            return Err(MdError::Internal(
                "the gradient pass returned no gradient".into(),
            ));
        };
        let dist = g
            .distributor()
            .ok_or_else(|| MdError::Internal("distributor missing".into()))?;
        // Ghost rows are images of owned atoms: their force share goes home.
        dist.reverse_sum(T::data_mut(&mut gpos), 3)?;
        // A deferred energy sum left pending holds this rank's share; only
        // the energy is read, so the other pending sums (which feed nothing)
        // need not be completed either.
        let energy_pending = self.defer_sums && g.is_pending(out.energy);
        if !energy_pending {
            g.resolve_pending()?;
        }
        g.ensure_host(&[out.energy])?;
        let mut energy = g.value(out.energy).to_vec();
        let dist = g
            .distributor()
            .ok_or_else(|| MdError::Internal("distributor missing".into()))?;
        let listed = |name: &str| self.spec.all_reduce_outputs.iter().any(|o| o == name);
        let strain_partial = self.defer_sums && listed("stress");
        if listed("stress") && !strain_partial {
            dist.all_reduce_sum(T::data_mut(&mut geps))?;
        }
        let energy_partial = energy_pending || (self.defer_sums && listed("energy"));
        if listed("energy") && !energy_partial {
            dist.all_reduce_sum(T::data_mut(&mut energy))?;
        }
        forces.clear();
        forces.extend(gpos[..n_owned * 3].chunks_exact(3).map(|c| {
            [
                -c[0].to_f64_lossless(),
                -c[1].to_f64_lossless(),
                -c[2].to_f64_lossless(),
            ]
        }));
        // The gradient's memory serves the next evaluation's ops.
        g.give_values(gpos);
        let mut strain_gradient = [0.0; 9];
        for (dst, src) in strain_gradient.iter_mut().zip(&geps) {
            *dst = src.to_f64_lossless();
        }
        self.phases.force_return += lap(&mut clock);
        Ok(RankForces {
            energy: energy[0].to_f64_lossless(),
            forces: Vec::new(),
            strain_gradient,
            pairs: n_pairs,
            energy_partial,
            strain_partial,
        })
    }
}

/// Candidate pairs per block of the cutoff filter: the kept pairs of a block
/// wait in two stack arrays (8 KiB together) and are appended in one copy.
const FILTER_BLOCK: usize = 1024;

/// Appends to `centers`/`neighbors` the candidate pairs of `rows` that a
/// fresh search at `cutoff` would keep (the same strict `<` on the squared
/// f64 distance), in list order.
///
/// Branch-free: every candidate is written to the block's stack arrays and
/// the write position advances by the comparison's outcome. With about one
/// candidate in four beyond the cutoff (skin 1 Å at a 10 Å cutoff), a
/// branch per candidate mispredicts often enough to cost more than the
/// distance itself, and pushing one pair at a time re-checks the vectors'
/// capacity per pair.
fn keep_within_cutoff(
    rows: &LocalRows<'_>,
    cutoff: f64,
    centers: &mut Vec<u32>,
    neighbors: &mut Vec<u32>,
) {
    let cut2 = cutoff * cutoff;
    let positions = rows.positions;
    let mut kept_centers = [0u32; FILTER_BLOCK];
    let mut kept_neighbors = [0u32; FILTER_BLOCK];
    for (block_centers, block_neighbors) in rows
        .centers
        .chunks(FILTER_BLOCK)
        .zip(rows.neighbors.chunks(FILTER_BLOCK))
    {
        let mut kept = 0;
        for (k, (&c, &n)) in block_centers.iter().zip(block_neighbors).enumerate() {
            let (a, b) = (positions[c as usize], positions[n as usize]);
            let d = [b[0] - a[0], b[1] - a[1], b[2] - a[2]];
            // `kept` ≤ k < FILTER_BLOCK.
            let slot = kept.min(k);
            kept_centers[slot] = c;
            kept_neighbors[slot] = n;
            kept += usize::from(d[0] * d[0] + d[1] * d[1] + d[2] * d[2] < cut2);
        }
        centers.extend_from_slice(&kept_centers[..kept]);
        neighbors.extend_from_slice(&kept_neighbors[..kept]);
    }
}

#[cfg(test)]
mod tests {
    use super::{keep_within_cutoff, LocalRows, FILTER_BLOCK};
    use ddmlip_atoms::Cell;

    /// The filter keeps exactly the pairs a one-pair-at-a-time test keeps,
    /// in list order, across block boundaries, with pairs at exactly the
    /// cutoff (dropped: the test is strict) and pairs of coincident atoms.
    #[test]
    fn the_branch_free_filter_keeps_what_a_plain_loop_keeps() {
        let cutoff = 2.0;
        // Atoms on a line 0.25 Å apart: many pairs at exactly 2 Å.
        let mut positions: Vec<[f64; 3]> = (0..40).map(|k| [0.25 * k as f64, 0.0, 0.0]).collect();
        positions.push(positions[3]);
        let n = positions.len() as u32;
        let mut centers = Vec::new();
        let mut neighbors = Vec::new();
        // Every ordered pair, several times: more than two blocks.
        while centers.len() < 2 * FILTER_BLOCK + 7 {
            for c in 0..n {
                for j in 0..n {
                    if j != c {
                        centers.push(c);
                        neighbors.push(j);
                    }
                }
            }
        }
        let rows = LocalRows {
            positions: &positions,
            numbers: &[],
            n_owned: positions.len(),
            centers: &centers,
            neighbors: &neighbors,
            cell: Cell::zero(),
        };
        let mut expected = (Vec::new(), Vec::new());
        for (&c, &j) in centers.iter().zip(&neighbors) {
            let (a, b) = (positions[c as usize], positions[j as usize]);
            let d2: f64 = (0..3).map(|k| (b[k] - a[k]) * (b[k] - a[k])).sum();
            if d2 < cutoff * cutoff {
                expected.0.push(c);
                expected.1.push(j);
            }
        }
        assert!(!expected.0.is_empty() && expected.0.len() < centers.len());
        // Appends to what is there.
        let mut kept = (vec![7u32], vec![9u32]);
        keep_within_cutoff(&rows, cutoff, &mut kept.0, &mut kept.1);
        assert_eq!((kept.0[0], kept.1[0]), (7, 9));
        assert_eq!(kept.0[1..], expected.0[..]);
        assert_eq!(kept.1[1..], expected.1[..]);
    }
}
