//! One rank's persistent share of a decomposed system: its owned atoms with
//! every per-atom quantity, its ghost images and halo plan, and the pair list
//! built with a skin. Lives across MD steps; rebuilt (with migration) only
//! when some atom has moved more than half the skin since the last build.

use crate::rank_eval::RankEvaluator;
use crate::MdError;
use ddmlip_atoms::{Cell, System};
use ddmlip_comm::Communicator;
use ddmlip_domain::{partition_system_balanced, Balance, HaloRuntime, LocalHaloPlan};
use ddmlip_engine::{DType, Model};
use ddmlip_neighbors::{pair_list_for_centers_into, NeighborOptions, PairList, PairScratch};
use ddmlip_spec::MLIPSpec;

/// Message tag of the per-step ghost position refresh.
const GHOST_TAG: u32 = 21;

/// What every rank knows about every atom and never changes during a run:
/// indexed by global atom id.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Atomic numbers by global id.
    pub numbers: Vec<u32>,
    /// Masses (u) by global id.
    pub masses: Vec<f64>,
    /// Periodicity per axis.
    pub pbc: [bool; 3],
}

impl Topology {
    /// Number of atoms.
    pub fn len(&self) -> usize {
        self.numbers.len()
    }

    /// True without atoms.
    pub fn is_empty(&self) -> bool {
        self.numbers.is_empty()
    }
}

/// How a rank builds its share.
#[derive(Debug, Clone, Copy)]
pub struct BuildOptions {
    /// The model's cutoff (Å).
    pub cutoff: f64,
    /// Verlet skin (Å): pairs are listed to `cutoff + skin` and the list is
    /// valid until an atom has moved `skin / 2`.
    pub skin: f64,
    /// Cutoffs of ghosts the model needs (`MLIPSpec::halo_depth`, at least 1).
    pub halo_depth: usize,
    /// Even atom counts instead of a regular grid.
    pub even_counts: bool,
    /// Whether the model reads the runtime graph (else no pair list is kept).
    pub with_pairs: bool,
}

/// One rank's atoms between two rebuilds. Local rows: owned `0..n_owned`,
/// then ghosts.
pub struct RankState {
    /// This rank's index in the communicator.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Owned then ghost positions (Å). Owned rows were wrapped into the cell
    /// at the last build and move freely since; ghost rows are their owners'
    /// positions plus a fixed image offset.
    pub positions: Vec<[f64; 3]>,
    /// Atomic numbers of every local row.
    pub numbers: Vec<u32>,
    /// Global ids of the owned rows, ascending at each build.
    pub gids: Vec<u64>,
    /// Momenta of the owned rows (u·Å per ASE time unit).
    pub momenta: Vec<[f64; 3]>,
    /// Masses of the owned rows (u).
    pub masses: Vec<f64>,
    /// Forces on the owned rows from the last evaluation (eV/Å).
    pub forces: Vec<[f64; 3]>,
    /// Global id of each ghost row.
    pub ghost_gids: Vec<u64>,
    /// Image shift of each ghost relative to its owner's local row.
    pub ghost_shifts: Vec<[i32; 3]>,
    /// `ghost_shifts` as Cartesian offsets in the current cell.
    ghost_offsets: Vec<[f64; 3]>,
    /// The cell (zero without one).
    pub cell: Cell,
    /// Candidate pairs (local rows) within cutoff + skin at the last build.
    pub centers: Vec<u32>,
    /// Neighbour rows of the candidate pairs, one per entry of `centers`.
    pub neighbors: Vec<u32>,
    /// Owned positions at the last build (for the displacement criterion).
    pub reference: Vec<[f64; 3]>,
    /// The unwrapped owned positions the last build started from: a restart
    /// rebuilds from them and so reproduces the same rows and pairs.
    pub build_positions: Vec<[f64; 3]>,
    /// The halo runtime (communicator + plan), lent to each evaluation.
    pub halo: Option<HaloRuntime>,
    /// Rebuilds so far (the initial build counts).
    pub rebuilds: u64,
    /// Atoms that changed owner over all rebuilds (counted on their new rank).
    pub migrated: u64,
    scratch: PairScratch,
}

/// Per-atom data handed to a build: unwrapped positions and momenta of the
/// atoms a rank owns (or, for the first build, any share of the atoms).
/// What a rebuild keeps from the state it replaces.
struct Previous {
    gids: Vec<u64>,
    rebuilds: u64,
    migrated: u64,
    scratch: PairScratch,
}

/// What one rank hands in to the first build: a disjoint share of the atoms (every atom in exactly one rank's share).
pub struct Share {
    /// Global ids of the atoms in this share.
    pub gids: Vec<u64>,
    /// Their positions (Å).
    pub positions: Vec<[f64; 3]>,
    /// Their momenta (ASE units).
    pub momenta: Vec<[f64; 3]>,
}

/// Per-atom 3-vectors.
pub type Rows = Vec<[f64; 3]>;

fn flat(v: &[[f64; 3]]) -> Vec<f64> {
    v.iter().flatten().copied().collect()
}

fn comm_err(op: &str) -> impl Fn(ddmlip_comm::CommError) -> MdError + '_ {
    move |e| MdError::Comm(format!("{op}: {e}"))
}

/// Every atom's positions and momenta from every rank's share, by global id. Fails when an
/// atom is missing or held twice: the check that no migration ever loses or
/// duplicates an atom.
pub fn gather_by_gid(
    comm: &dyn Communicator,
    n_atoms: usize,
    share: &Share,
) -> Result<(Rows, Rows), MdError> {
    let ids = comm
        .all_gather_u64(&share.gids)
        .map_err(comm_err("gather ids"))?;
    let pos = comm
        .all_gather_f64(&flat(&share.positions))
        .map_err(comm_err("gather positions"))?;
    let mom = comm
        .all_gather_f64(&flat(&share.momenta))
        .map_err(comm_err("gather momenta"))?;
    let mut positions = vec![[f64::NAN; 3]; n_atoms];
    let mut momenta = vec![[f64::NAN; 3]; n_atoms];
    let mut holder = vec![usize::MAX; n_atoms];
    for (rank, ((ids, p), m)) in ids.iter().zip(&pos).zip(&mom).enumerate() {
        if p.len() != ids.len() * 3 || m.len() != ids.len() * 3 {
            return Err(MdError::Internal(format!(
                "rank {rank} sent {} ids but {} position values",
                ids.len(),
                p.len()
            )));
        }
        for (k, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= n_atoms {
                return Err(MdError::Ownership(format!(
                    "rank {rank} holds atom {id}, but the system has {n_atoms} atoms"
                )));
            }
            if holder[id] != usize::MAX {
                return Err(MdError::Ownership(format!(
                    "atom {id} is held by rank {} and by rank {rank}",
                    holder[id]
                )));
            }
            holder[id] = rank;
            positions[id] = [p[3 * k], p[3 * k + 1], p[3 * k + 2]];
            momenta[id] = [m[3 * k], m[3 * k + 1], m[3 * k + 2]];
        }
    }
    if let Some(lost) = holder.iter().position(|&h| h == usize::MAX) {
        return Err(MdError::Ownership(format!(
            "atom {lost} is held by no rank"
        )));
    }
    Ok((positions, momenta))
}

fn add(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
}

/// The start every run shares: resolves the spec (`spec`, else the model's
/// declared one, else the standard energy model), the build options, hands
/// every rank a disjoint share of the atoms (rank r takes every size-th
/// atom of `positions`/`momenta`, indexed by global id) for the first
/// build, and makes the rank's evaluator. Collective.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decompose<'m>(
    model: &'m dyn Model,
    spec: Option<MLIPSpec>,
    skin: f64,
    even_counts: bool,
    dtype: DType,
    topology: &Topology,
    cell: Cell,
    positions: &[[f64; 3]],
    momenta: &[[f64; 3]],
    comm: Box<dyn Communicator>,
) -> Result<(RankState, BuildOptions, RankEvaluator<'m>), MdError> {
    let spec = spec
        .or_else(|| model.declared_spec())
        .unwrap_or_else(MLIPSpec::standard_energy_model);
    let opts = BuildOptions {
        cutoff: model.cutoff(),
        skin,
        halo_depth: spec.halo_depth.max(1) as usize,
        even_counts,
        with_pairs: model.uses_runtime_graph(),
    };
    let (rank, size) = (comm.rank(), comm.size());
    // Any disjoint split will do for the first build.
    let mine: Vec<usize> = (rank..topology.len()).step_by(size).collect();
    let share = Share {
        gids: mine.iter().map(|&i| i as u64).collect(),
        positions: mine.iter().map(|&i| positions[i]).collect(),
        momenta: mine.iter().map(|&i| momenta[i]).collect(),
    };
    let state = RankState::initial(comm, spec.clone(), topology, cell, &share, &opts)?;
    Ok((state, opts, RankEvaluator::new(model, spec, dtype)))
}

impl RankState {
    /// The first build: every rank passes a share of the atoms (any split,
    /// e.g. all atoms on rank 0 or every rank the same disjoint slice).
    /// Collective; see [`RankState::rebuild`].
    pub fn initial(
        comm: Box<dyn Communicator>,
        spec: ddmlip_spec::MLIPSpec,
        topology: &Topology,
        cell: Cell,
        share: &Share,
        opts: &BuildOptions,
    ) -> Result<RankState, MdError> {
        let halo = HaloRuntime::new(comm, LocalHaloPlan::default(), spec);
        Self::build(halo, topology, cell, share, opts, None)
    }

    /// Migrates atoms to their new owners and rebuilds ghosts, halo plan and
    /// pair list from the current positions (as `RankState::build` does).
    /// Collective.
    pub fn rebuild(self, topology: &Topology, opts: &BuildOptions) -> Result<RankState, MdError> {
        let share = self.share();
        self.rebuild_from(topology, &share, opts)
    }

    /// [`RankState::rebuild`] from a given share (a restart's build positions).
    pub fn rebuild_from(
        mut self,
        topology: &Topology,
        share: &Share,
        opts: &BuildOptions,
    ) -> Result<RankState, MdError> {
        let halo = self
            .halo
            .take()
            .ok_or_else(|| MdError::Internal("the rank's communicator is missing".into()))?;
        let cell = self.cell;
        let prev = Previous {
            gids: std::mem::take(&mut self.gids),
            rebuilds: self.rebuilds,
            migrated: self.migrated,
            scratch: std::mem::take(&mut self.scratch),
        };
        Self::build(halo, topology, cell, share, opts, Some(prev))
    }

    /// Builds this rank's share from every rank's `share`: gathers all atoms
    /// by global id (checking none is lost or duplicated), partitions the
    /// system — the same pure function on every rank —, wraps the atoms this
    /// rank now owns into the cell, and lays out its ghosts, halo plan and
    /// skin pair list.
    fn build(
        mut halo: HaloRuntime,
        topology: &Topology,
        cell: Cell,
        share: &Share,
        opts: &BuildOptions,
        previous: Option<Previous>,
    ) -> Result<RankState, MdError> {
        let (rank, size) = (halo.comm.rank(), halo.comm.size());
        let (positions, momenta) = gather_by_gid(halo.comm.as_ref(), topology.len(), share)?;
        let sys = System::new(
            positions.clone(),
            topology.numbers.clone(),
            (!cell.is_zero()).then_some(cell),
            topology.pbc,
        );
        let width = opts.halo_depth.max(1) as f64 * (opts.cutoff + opts.skin);
        let balance = if opts.even_counts {
            Balance::EvenCounts
        } else {
            Balance::Geometric
        };
        let part = partition_system_balanced(&sys, size, width, balance)
            .map_err(|e| MdError::Input(format!("cannot partition the system: {e}")))?;
        let dom = &part.ranks[rank];
        let n_owned = dom.owned.len();
        let mut local = Vec::with_capacity(dom.n_local());
        let mut numbers = Vec::with_capacity(dom.n_local());
        for (k, &j) in dom.owned.iter().enumerate() {
            local.push(add(positions[j], cell.shift_vector(dom.owned_shifts[k])));
            numbers.push(topology.numbers[j]);
        }
        let mut ghost_gids = Vec::with_capacity(dom.ghosts.len());
        let mut ghost_shifts = Vec::with_capacity(dom.ghosts.len());
        let mut ghost_offsets = Vec::with_capacity(dom.ghosts.len());
        for gh in &dom.ghosts {
            let owner = &part.ranks[gh.owner_rank];
            let os = owner.owned_shifts[gh.owner_row];
            // The owner's local row, computed as the owner computes it, plus
            // the image offset: exactly what a later refresh produces.
            let owner_row = add(positions[gh.global], cell.shift_vector(os));
            let s = [
                gh.shift[0] - os[0],
                gh.shift[1] - os[1],
                gh.shift[2] - os[2],
            ];
            let offset = cell.shift_vector(s);
            local.push(add(owner_row, offset));
            numbers.push(topology.numbers[gh.global]);
            ghost_gids.push(gh.global as u64);
            ghost_shifts.push(s);
            ghost_offsets.push(offset);
        }
        // Halo plan: for each peer, my owned rows it holds as ghosts (in its
        // ghost order) and my ghost rows it owns (in my ghost order).
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for peer in 0..size {
            let rows: Vec<u32> = part.ranks[peer]
                .ghosts
                .iter()
                .filter(|gh| gh.owner_rank == rank)
                .map(|gh| gh.owner_row as u32)
                .collect();
            if !rows.is_empty() {
                sends.push((peer, rows));
            }
            let rows: Vec<u32> = dom
                .ghosts
                .iter()
                .enumerate()
                .filter(|(_, gh)| gh.owner_rank == peer)
                .map(|(k, _)| (n_owned + k) as u32)
                .collect();
            if !rows.is_empty() {
                recvs.push((peer, rows));
            }
        }
        let plan = LocalHaloPlan {
            n_owned,
            n_local: local.len(),
            sends,
            recvs,
        };
        let gids: Vec<u64> = dom.owned.iter().map(|&j| j as u64).collect();
        let (mut scratch, rebuilds, migrated) = match previous {
            Some(prev) => {
                // Atoms this rank owns now but did not own before arrived here.
                let before: std::collections::HashSet<u64> = prev.gids.iter().copied().collect();
                let arrived = gids.iter().filter(|g| !before.contains(g)).count() as u64;
                (prev.scratch, prev.rebuilds + 1, prev.migrated + arrived)
            }
            None => (PairScratch::default(), 1, 0),
        };
        halo.plan = plan;
        let mut pairs = PairList::default();
        if opts.with_pairs {
            pair_list_for_centers_into(
                &local,
                None,
                [false; 3],
                &NeighborOptions {
                    cutoff: opts.cutoff + opts.skin,
                    half: false,
                },
                n_owned,
                &mut scratch,
                &mut pairs,
            )
            .map_err(|e| MdError::Input(format!("neighbour search: {e}")))?;
            if let Some((e, d)) = pairs.closest.filter(|&(_, d)| d < 1e-6) {
                let gid = |row: u32| -> u64 {
                    let row = row as usize;
                    if row < n_owned {
                        gids[row]
                    } else {
                        ghost_gids[row - n_owned]
                    }
                };
                return Err(MdError::Input(format!(
                    "atoms {} and {} are {d:.2e} Å apart; the model cannot be evaluated there",
                    gid(pairs.centers[e]),
                    gid(pairs.neighbors[e])
                )));
            }
        }
        let owned_positions = local[..n_owned].to_vec();
        Ok(RankState {
            rank,
            size,
            numbers,
            momenta: gids.iter().map(|&g| momenta[g as usize]).collect(),
            masses: gids.iter().map(|&g| topology.masses[g as usize]).collect(),
            forces: vec![[0.0; 3]; n_owned],
            build_positions: gids.iter().map(|&g| positions[g as usize]).collect(),
            gids,
            reference: owned_positions,
            positions: local,
            ghost_gids,
            ghost_shifts,
            ghost_offsets,
            cell,
            centers: pairs.centers,
            neighbors: pairs.neighbors,
            halo: Some(halo),
            rebuilds,
            migrated,
            scratch,
        })
    }

    /// Number of owned atoms.
    pub fn n_owned(&self) -> usize {
        self.gids.len()
    }

    /// The communicator (held by the halo runtime between evaluations).
    pub fn comm(&self) -> Result<&dyn Communicator, MdError> {
        self.halo
            .as_ref()
            .map(|h| h.comm.as_ref())
            .ok_or_else(|| MdError::Internal("the rank's communicator is missing".into()))
    }

    /// The owned atoms' current data, to hand to the next build.
    pub fn share(&self) -> Share {
        Share {
            gids: self.gids.clone(),
            positions: self.positions[..self.n_owned()].to_vec(),
            momenta: self.momenta.clone(),
        }
    }

    /// Largest squared displacement of an owned atom since the last build.
    pub fn max_displacement2(&self) -> f64 {
        self.positions
            .iter()
            .zip(&self.reference)
            .map(|(p, r)| {
                let d = [p[0] - r[0], p[1] - r[1], p[2] - r[2]];
                d[0] * d[0] + d[1] * d[1] + d[2] * d[2]
            })
            .fold(0.0, f64::max)
    }

    /// Copies every owner's current position into its ghost images (plus the
    /// image offset) through the halo plan. Collective.
    pub fn refresh_ghosts(&mut self) -> Result<(), MdError> {
        let halo = self
            .halo
            .as_ref()
            .ok_or_else(|| MdError::Internal("the rank's communicator is missing".into()))?;
        let sends: Vec<(usize, Vec<f64>)> = halo
            .plan
            .sends
            .iter()
            .map(|(peer, rows)| {
                let mut buf = Vec::with_capacity(rows.len() * 3);
                for &r in rows {
                    buf.extend_from_slice(&self.positions[r as usize]);
                }
                (*peer, buf)
            })
            .collect();
        let refs: Vec<(usize, &[f64])> = sends.iter().map(|(p, b)| (*p, b.as_slice())).collect();
        let from: Vec<usize> = halo.plan.recvs.iter().map(|(p, _)| *p).collect();
        let got = halo
            .comm
            .exchange_f64(&refs, &from, GHOST_TAG)
            .map_err(comm_err("ghost refresh"))?;
        let n_owned = self.n_owned();
        for ((_, rows), buf) in halo.plan.recvs.iter().zip(got) {
            if buf.len() != rows.len() * 3 {
                return Err(MdError::Comm(format!(
                    "ghost refresh: received {} values, expected {}",
                    buf.len(),
                    rows.len() * 3
                )));
            }
            for (k, &r) in rows.iter().enumerate() {
                let r = r as usize;
                let owner = [buf[3 * k], buf[3 * k + 1], buf[3 * k + 2]];
                self.positions[r] = add(owner, self.ghost_offsets[r - n_owned]);
            }
        }
        Ok(())
    }
}
