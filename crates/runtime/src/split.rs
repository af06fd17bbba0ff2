//! What every rank of one decomposed evaluation shares: the spec, the
//! partition of every system and where each system's rows live on each rank.

use crate::{EvalError, EvalOptions};
use ddmlip_atoms::System;
use ddmlip_domain::{partition_system_balanced, LocalHaloPlan, Partition};
use ddmlip_engine::Model;
use ddmlip_spec::MLIPSpec;
use std::time::Instant;

/// Where each system's rows live on each rank.
pub(crate) struct Layout {
    /// [rank][system] → first owned local row.
    pub(crate) owned_offset: Vec<Vec<usize>>,
    /// [rank][system] → first ghost local row.
    pub(crate) ghost_offset: Vec<Vec<usize>>,
    pub(crate) n_owned: Vec<usize>,
    pub(crate) n_local: Vec<usize>,
    /// First batch-level atom id of each system.
    pub(crate) atom_offset: Vec<usize>,
}

impl Layout {
    pub(crate) fn new(parts: &[Partition], batch: &[System], ranks: usize) -> Self {
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
    pub(crate) fn plan(&self, parts: &[Partition], rank: usize) -> LocalHaloPlan {
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

/// The spec a decomposed run follows, the partition of every system over
/// `ranks` and the row layout (the same on every rank: a pure function of
/// the input). `started` is when the evaluation call began.
pub(crate) fn plan_split(
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

/// What every rank of one decomposed evaluation shares.
pub(crate) struct Split {
    pub(crate) parts: Vec<Partition>,
    pub(crate) layout: Layout,
    pub(crate) spec: MLIPSpec,
    /// When the evaluation call began (rank timings are relative to it).
    pub(crate) started: Instant,
    /// Seconds spent computing `parts` and `layout`.
    pub(crate) partition_s: f64,
    /// Ranks are separate processes: rank 0 gathers every rank's outputs.
    /// Otherwise each rank returns its share to the caller.
    pub(crate) gather_to_root: bool,
}
