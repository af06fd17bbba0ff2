//! One rank's persistent share of a decomposed system: its owned atoms with
//! every per-atom quantity, its ghost images and halo plan, and the pair list
//! built with a skin. Lives across MD steps; rebuilt (with migration) only
//! when some atom has moved more than half the skin since the last build.

use crate::collective::reduce;
use crate::rank_eval::RankEvaluator;
use crate::MdError;
use ddmlip_atoms::{Cell, System};
use ddmlip_comm::Communicator;
use ddmlip_domain::{
    partition_system_mapped, Balance, DomainMap, HaloRuntime, ImageScratch, LocalHaloPlan,
};
use ddmlip_engine::{DType, Model};
use ddmlip_neighbors::{pair_list_for_centers_into, NeighborOptions, PairList, PairScratch};
use ddmlip_spec::MLIPSpec;

/// Message tag of the per-step ghost position refresh.
const GHOST_TAG: u32 = 21;
/// Message tag of atoms migrating to a neighbour rank.
const MIGRATE_TAG: u32 = 22;
/// Message tag of the ghost rows a rank hands its neighbours at a rebuild.
const GHOST_BUILD_TAG: u32 = 23;
/// Values per migrating atom: global id, position, momentum, mass, number.
const MIGRANT_LEN: usize = 9;
/// Values per ghost row handed over: global id, image shift, owner's row
/// position, number.
const GHOST_LEN: usize = 8;

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
    /// Rebuilds between scheduled full repartitions (0: none); see
    /// [`crate::MdConfig::repartition_every`].
    pub repartition_every: u64,
    /// Owned-atom imbalance (max / mean) beyond which a rebuild
    /// repartitions; see [`crate::MdConfig::max_imbalance`].
    pub max_imbalance: f64,
    /// Migrate point to point between repartitions (else gather everything
    /// and partition with the same domains); see
    /// [`crate::MdConfig::point_to_point`].
    pub point_to_point: bool,
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
    /// Full (collective) partitions so far, the initial build included; the
    /// other rebuilds migrated atoms point to point.
    pub repartitions: u64,
    /// The domain boundaries in use since the last full partition.
    pub domains: DomainMap,
    /// The ranks this rank exchanges migrating atoms and ghosts with
    /// ([`DomainMap::neighbours`]), ascending.
    pub neighbours: Vec<usize>,
    scratch: PairScratch,
    /// Send buffers of the ghost refresh, one per peer, refilled every step.
    ghost_sends: Vec<Vec<f64>>,
}

/// Per-atom data handed to a build: unwrapped positions and momenta of the
/// atoms a rank owns (or, for the first build, any share of the atoms).
/// What a rebuild keeps from the state it replaces.
struct Previous {
    gids: Vec<u64>,
    rebuilds: u64,
    migrated: u64,
    repartitions: u64,
    scratch: PairScratch,
}

/// Where a build placed this rank's rows, before the pair list: owned rows
/// (ascending global id, wrapped into the cell) then ghost rows, and the
/// halo plan's peers.
struct Placement {
    gids: Vec<u64>,
    /// Owned then ghost positions.
    local: Vec<[f64; 3]>,
    numbers: Vec<u32>,
    momenta: Vec<[f64; 3]>,
    masses: Vec<f64>,
    build_positions: Vec<[f64; 3]>,
    ghost_gids: Vec<u64>,
    ghost_shifts: Vec<[i32; 3]>,
    ghost_offsets: Vec<[f64; 3]>,
    sends: Vec<(usize, Vec<u32>)>,
    recvs: Vec<(usize, Vec<u32>)>,
    domains: DomainMap,
    /// Made by a full partition (collective) rather than locally.
    full: bool,
}

/// An owned atom on its way through a local rebuild.
struct Carried {
    gid: u64,
    /// Current (unwrapped) position.
    position: [f64; 3],
    momentum: [f64; 3],
    mass: f64,
    number: u32,
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
    domains: Option<&DomainMap>,
    repartition: (u64, f64, bool),
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
        repartition_every: repartition.0,
        max_imbalance: repartition.1,
        point_to_point: repartition.2,
    };
    let (rank, size) = (comm.rank(), comm.size());
    // Domains made for another rank count do not apply.
    let domains = domains.filter(|d| d.n_ranks() == size);
    // Any disjoint split will do for the first build.
    let mine: Vec<usize> = (rank..topology.len()).step_by(size).collect();
    let share = Share {
        gids: mine.iter().map(|&i| i as u64).collect(),
        positions: mine.iter().map(|&i| positions[i]).collect(),
        momenta: mine.iter().map(|&i| momenta[i]).collect(),
    };
    let state = RankState::initial(comm, spec.clone(), topology, cell, &share, &opts, domains)?;
    Ok((state, opts, RankEvaluator::new(model, spec, dtype)))
}

impl RankState {
    /// The first build: every rank passes a share of the atoms (any split,
    /// e.g. all atoms on rank 0 or every rank the same disjoint slice), and
    /// the domains to use (`None`: place them). Collective; see
    /// [`RankState::rebuild`].
    pub fn initial(
        comm: Box<dyn Communicator>,
        spec: ddmlip_spec::MLIPSpec,
        topology: &Topology,
        cell: Cell,
        share: &Share,
        opts: &BuildOptions,
        domains: Option<&DomainMap>,
    ) -> Result<RankState, MdError> {
        let halo = HaloRuntime::new(comm, LocalHaloPlan::default(), spec);
        let (placement, halo) = Self::place_full(halo, topology, cell, share, opts, domains)?;
        Self::finish(halo, placement, cell, opts, None)
    }

    /// Migrates atoms to their new owners and rebuilds ghosts, halo plan and
    /// pair list from the current positions.
    ///
    /// Between repartitions the domains stay fixed: each rank sends the
    /// atoms that left its domain to their new owners, which are among its
    /// [`RankState::neighbours`], with all their per-atom data, and hands
    /// every neighbour the images of its atoms that fall in that
    /// neighbour's ghost region. The rows, ghosts and plan are exactly those
    /// of a full partition with the same domains. Its one collective is a
    /// three-number reduction (atom count, atoms that could not be placed,
    /// largest share). A full, collective repartition (all positions
    /// gathered, domains placed afresh) happens instead when the cell
    /// changed, every [`BuildOptions::repartition_every`] rebuilds, when the
    /// largest share exceeds [`BuildOptions::max_imbalance`] times the mean
    /// (the last two only where the domains can move), or when an atom
    /// moved beyond the neighbouring domains. Collective.
    pub fn rebuild(self, topology: &Topology, opts: &BuildOptions) -> Result<RankState, MdError> {
        let scheduled = opts.repartition_every > 0
            && self.domains.can_change()
            && self.rebuilds % opts.repartition_every == 0;
        if scheduled || !map_fits_cell(&self.domains, &self.cell) {
            let share = self.share();
            return self.rebuild_from(topology, &share, opts, None);
        }
        if !opts.point_to_point {
            let share = self.share();
            let domains = self.domains.clone();
            return self.rebuild_from(topology, &share, opts, Some(&domains));
        }
        self.rebuild_local(topology, opts)
    }

    /// A full, collective rebuild from a given share (every rank's current
    /// atoms) with the given domains (`None`: placed afresh).
    pub fn rebuild_from(
        mut self,
        topology: &Topology,
        share: &Share,
        opts: &BuildOptions,
        domains: Option<&DomainMap>,
    ) -> Result<RankState, MdError> {
        let (halo, prev) = self.take_previous()?;
        let (placement, halo) = Self::place_full(halo, topology, self.cell, share, opts, domains)?;
        Self::finish(halo, placement, self.cell, opts, Some(prev))
    }

    fn take_previous(&mut self) -> Result<(HaloRuntime, Previous), MdError> {
        let halo = self
            .halo
            .take()
            .ok_or_else(|| MdError::Internal("the rank's communicator is missing".into()))?;
        let prev = Previous {
            gids: std::mem::take(&mut self.gids),
            rebuilds: self.rebuilds,
            migrated: self.migrated,
            repartitions: self.repartitions,
            scratch: std::mem::take(&mut self.scratch),
        };
        Ok((halo, prev))
    }

    /// The point-to-point rebuild of [`RankState::rebuild`].
    fn rebuild_local(
        mut self,
        topology: &Topology,
        opts: &BuildOptions,
    ) -> Result<RankState, MdError> {
        let n_atoms = topology.len();
        let (rank, size) = (self.rank, self.size);
        let map = &self.domains;
        let peers = &self.neighbours;
        let comm = self
            .halo
            .as_ref()
            .map(|h| h.comm.as_ref())
            .ok_or_else(|| MdError::Internal("the rank's communicator is missing".into()))?;
        // Migration: owned atoms whose position now lies in another domain
        // go to its rank, with everything that belongs to them.
        let n = self.n_owned();
        let mut outgoing: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
        let mut atoms = Vec::with_capacity(n);
        let mut strays = 0usize;
        for k in 0..n {
            let r = self.positions[k];
            let dest = map.owner(map.wrap(r).0);
            let slot = (dest != rank).then(|| peers.binary_search(&dest).ok());
            match slot {
                Some(Some(i)) => {
                    let p = self.momenta[k];
                    outgoing[i].extend_from_slice(&[
                        self.gids[k] as f64,
                        r[0],
                        r[1],
                        r[2],
                        p[0],
                        p[1],
                        p[2],
                        self.masses[k],
                        f64::from(self.numbers[k]),
                    ]);
                }
                // Not a neighbour's: kept here, and the rebuild falls back to
                // a full repartition below.
                Some(None) | None => {
                    strays += usize::from(slot.is_some());
                    atoms.push(Carried {
                        gid: self.gids[k],
                        position: r,
                        momentum: self.momenta[k],
                        mass: self.masses[k],
                        number: self.numbers[k],
                    });
                }
            }
        }
        let sends: Vec<(usize, &[f64])> = peers
            .iter()
            .zip(&outgoing)
            .map(|(&p, b)| (p, b.as_slice()))
            .collect();
        let got = comm
            .exchange_f64(&sends, peers, MIGRATE_TAG)
            .map_err(comm_err("migration"))?;
        for (&peer, buf) in peers.iter().zip(&got) {
            if buf.len() % MIGRANT_LEN != 0 {
                let e = format!("rank {peer} sent {} values, not whole atoms", buf.len());
                comm.abort(&e);
                return Err(MdError::Comm(format!("migration: {e}")));
            }
            for a in buf.chunks_exact(MIGRANT_LEN) {
                atoms.push(Carried {
                    gid: a[0] as u64,
                    position: [a[1], a[2], a[3]],
                    momentum: [a[4], a[5], a[6]],
                    mass: a[7],
                    number: a[8] as u32,
                });
            }
        }
        atoms.sort_unstable_by_key(|a| a.gid);
        // The rebuild's one collective: no atom may be lost, and whether
        // this rebuild must repartition instead.
        let (sums, maxes) = reduce(
            comm,
            &[atoms.len() as f64, strays as f64],
            &[atoms.len() as f64],
        )?;
        if sums[0] != n_atoms as f64 {
            return Err(MdError::Ownership(format!(
                "after migration the ranks own {} atoms of {n_atoms}",
                sums[0]
            )));
        }
        let share = Share {
            gids: atoms.iter().map(|a| a.gid).collect(),
            positions: atoms.iter().map(|a| a.position).collect(),
            momenta: atoms.iter().map(|a| a.momentum).collect(),
        };
        if cfg!(debug_assertions) {
            // Every id exactly once (a full gather: debug builds only).
            gather_by_gid(comm, n_atoms, &share)?;
        }
        let imbalance = maxes[0] * size as f64 / n_atoms as f64;
        if sums[1] > 0.0 || (map.can_change() && imbalance > opts.max_imbalance) {
            return self.rebuild_from(topology, &share, opts, None);
        }
        let placement = self.place_local(atoms)?;
        let (halo, prev) = self.take_previous()?;
        Self::finish(halo, placement, self.cell, opts, Some(prev))
    }

    /// Owned rows from the atoms this rank now owns (ascending id), and the
    /// ghost rows its neighbours hand it: each rank walks its own atoms
    /// through [`DomainMap::for_each_image`] and sends every neighbour the
    /// images in its ghost region (global id, image shift, the owner's
    /// wrapped row, number). Received per owner rank in ascending order,
    /// they are the ghosts of a full partition, in its order.
    fn place_local(&self, atoms: Vec<Carried>) -> Result<Placement, MdError> {
        let rank = self.rank;
        let map = &self.domains;
        let cell = self.cell;
        let comm = self.comm()?;
        // Neighbours and this rank (its own periodic images), ascending.
        let mut peers = self.neighbours.clone();
        let me = peers.partition_point(|&p| p < rank);
        peers.insert(me, rank);
        let mut outgoing: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
        let mut send_rows: Vec<Vec<u32>> = vec![Vec::new(); peers.len()];
        let n_owned = atoms.len();
        let mut local = Vec::with_capacity(n_owned);
        let mut scratch = ImageScratch::default();
        let mut outside = None;
        for (k, a) in atoms.iter().enumerate() {
            let (f, w) = map.wrap(a.position);
            let row = add(a.position, cell.shift_vector(w));
            local.push(row);
            map.for_each_image(f, rank, &mut scratch, |to, m| {
                match peers.binary_search(&to) {
                    Ok(i) => {
                        outgoing[i].extend_from_slice(&[
                            a.gid as f64,
                            f64::from(m[0]),
                            f64::from(m[1]),
                            f64::from(m[2]),
                            row[0],
                            row[1],
                            row[2],
                            f64::from(a.number),
                        ]);
                        send_rows[i].push(k as u32);
                    }
                    Err(_) => outside = Some((a.gid, to)),
                }
            });
        }
        if let Some((gid, to)) = outside {
            // Only this rank knows: tell the peers rather than leave them
            // waiting in the exchange.
            let e = MdError::Internal(format!(
                "atom {gid} has a ghost image on rank {to}, which is not a neighbour of rank {rank}"
            ));
            comm.abort(&e.to_string());
            return Err(e);
        }
        let refs: Vec<(usize, &[f64])> = peers
            .iter()
            .zip(&outgoing)
            .map(|(&p, b)| (p, b.as_slice()))
            .collect();
        let got = comm
            .exchange_f64(&refs, &peers, GHOST_BUILD_TAG)
            .map_err(comm_err("ghost search"))?;
        let n_ghosts: usize = got.iter().map(|b| b.len() / GHOST_LEN).sum();
        let mut numbers: Vec<u32> = atoms.iter().map(|a| a.number).collect();
        numbers.reserve(n_ghosts);
        local.reserve(n_ghosts);
        let mut ghost_gids = Vec::with_capacity(n_ghosts);
        let mut ghost_shifts = Vec::with_capacity(n_ghosts);
        let mut ghost_offsets = Vec::with_capacity(n_ghosts);
        let mut recvs = Vec::new();
        for (&peer, buf) in peers.iter().zip(&got) {
            if buf.len() % GHOST_LEN != 0 {
                let e = format!("rank {peer} sent {} values, not whole rows", buf.len());
                comm.abort(&e);
                return Err(MdError::Comm(format!("ghost search: {e}")));
            }
            let first = local.len() as u32;
            for g in buf.chunks_exact(GHOST_LEN) {
                let shift = [g[1] as i32, g[2] as i32, g[3] as i32];
                // The owner's row plus the image offset: exactly what a
                // refresh produces.
                let offset = cell.shift_vector(shift);
                local.push(add([g[4], g[5], g[6]], offset));
                numbers.push(g[7] as u32);
                ghost_gids.push(g[0] as u64);
                ghost_shifts.push(shift);
                ghost_offsets.push(offset);
            }
            if local.len() as u32 > first {
                recvs.push((peer, (first..local.len() as u32).collect()));
            }
        }
        let sends = peers
            .iter()
            .zip(send_rows)
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(&p, rows)| (p, rows))
            .collect();
        Ok(Placement {
            gids: atoms.iter().map(|a| a.gid).collect(),
            momenta: atoms.iter().map(|a| a.momentum).collect(),
            masses: atoms.iter().map(|a| a.mass).collect(),
            build_positions: atoms.iter().map(|a| a.position).collect(),
            local,
            numbers,
            ghost_gids,
            ghost_shifts,
            ghost_offsets,
            sends,
            recvs,
            domains: map.clone(),
            full: false,
        })
    }

    /// Places this rank's rows from every rank's `share` with a full
    /// partition: gathers all atoms by global id (checking none is lost or
    /// duplicated), partitions the system with `domains` (or domains placed
    /// afresh) — the same pure function on every rank —, wraps the atoms
    /// this rank now owns into the cell, and lays out its ghosts and halo
    /// peers. Collective.
    fn place_full(
        halo: HaloRuntime,
        topology: &Topology,
        cell: Cell,
        share: &Share,
        opts: &BuildOptions,
        domains: Option<&DomainMap>,
    ) -> Result<(Placement, HaloRuntime), MdError> {
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
        let (part, domains) = partition_system_mapped(&sys, size, width, balance, domains)
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
        let gids: Vec<u64> = dom.owned.iter().map(|&j| j as u64).collect();
        let placement = Placement {
            momenta: gids.iter().map(|&g| momenta[g as usize]).collect(),
            masses: gids.iter().map(|&g| topology.masses[g as usize]).collect(),
            build_positions: gids.iter().map(|&g| positions[g as usize]).collect(),
            gids,
            local,
            numbers,
            ghost_gids,
            ghost_shifts,
            ghost_offsets,
            sends,
            recvs,
            domains,
            full: true,
        };
        Ok((placement, halo))
    }

    /// Completes a build from its placement: the halo plan, the skin pair
    /// list, the counters.
    fn finish(
        mut halo: HaloRuntime,
        placement: Placement,
        cell: Cell,
        opts: &BuildOptions,
        previous: Option<Previous>,
    ) -> Result<RankState, MdError> {
        let (rank, size) = (halo.comm.rank(), halo.comm.size());
        let Placement {
            gids,
            local,
            numbers,
            momenta,
            masses,
            build_positions,
            ghost_gids,
            ghost_shifts,
            ghost_offsets,
            sends,
            recvs,
            domains,
            full,
        } = placement;
        let n_owned = gids.len();
        let plan = LocalHaloPlan {
            n_owned,
            n_local: local.len(),
            sends,
            recvs,
        };
        let (mut scratch, rebuilds, migrated, repartitions) = match previous {
            Some(prev) => {
                // Atoms this rank owns now but did not own before arrived here.
                let before: std::collections::HashSet<u64> = prev.gids.iter().copied().collect();
                let arrived = gids.iter().filter(|g| !before.contains(g)).count() as u64;
                (
                    prev.scratch,
                    prev.rebuilds + 1,
                    prev.migrated + arrived,
                    prev.repartitions + u64::from(full),
                )
            }
            None => (PairScratch::default(), 1, 0, 1),
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
        let neighbours = domains.neighbours(rank);
        Ok(RankState {
            rank,
            size,
            numbers,
            momenta,
            masses,
            forces: vec![[0.0; 3]; n_owned],
            build_positions,
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
            repartitions,
            domains,
            neighbours,
            scratch,
            ghost_sends: Vec::new(),
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
        let sends = &mut self.ghost_sends;
        sends.resize_with(halo.plan.sends.len(), Vec::new);
        for ((_, rows), buf) in halo.plan.sends.iter().zip(sends.iter_mut()) {
            buf.clear();
            for &r in rows {
                buf.extend_from_slice(&self.positions[r as usize]);
            }
        }
        let refs: Vec<(usize, &[f64])> = halo
            .plan
            .sends
            .iter()
            .zip(sends.iter())
            .map(|((p, _), b)| (*p, b.as_slice()))
            .collect();
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

/// Whether `map` was made for `cell` (its frame is the cell's, bit for bit,
/// or the identity of a system without a usable cell).
fn map_fits_cell(map: &DomainMap, cell: &Cell) -> bool {
    let frame = if !cell.is_zero() && cell.inverse().is_ok() {
        cell.matrix
    } else {
        Cell::orthorhombic(1.0, 1.0, 1.0).matrix
    };
    frame.map(|r| r.map(f64::to_bits)) == map.frame.map(|r| r.map(f64::to_bits))
}
