//! Decomposed runs on GPUs: the system split over `N` ranks in space
//! (`ddmlip-domain`'s partition, ghosts within one cutoff of each domain),
//! every rank a thread with its own stream on one of the GPUs (all on one,
//! or round-robin over several), halos through the threads communicator
//! by way of the host. The answer equals the single-GPU run to rounding,
//! which is what `validate --device cuda` checks.
//!
//! What crosses between ranks depends on the model: Lennard-Jones needs
//! nothing (an owned atom's row of the full list sees every neighbour);
//! SevenNet refreshes the ghosts' node features after every interaction
//! block and returns their gradients, and the forces on ghosts, to their
//! owners. Energies and virials are summed over ranks in rank order.

use crate::{CudaDevice, CudaError, GpuModel, GpuOutput, GpuTimings, Precision};
use ddmlip_atoms::System;
use ddmlip_comm::{thread_world, Buffer, Communicator, SendBuf, ThreadsConfig};
use ddmlip_domain::{halo_plans, partition_system, HaloRuntime, LocalHaloPlan, RankDomain};
use ddmlip_engine::{DataMut, Distributor};
use ddmlip_spec::MLIPSpec;
use std::time::{Duration, Instant};

/// How one rank of a decomposed GPU run went.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRankReport {
    /// The rank.
    pub rank: usize,
    /// Atoms the rank owns.
    pub owned: usize,
    /// Ghost images it holds.
    pub ghosts: usize,
    /// Directed pairs of its local neighbour list.
    pub pairs: usize,
    /// Wall time of the rank's evaluation (s), exchanges included.
    pub seconds: f64,
    /// Of which in halo exchanges and reductions (s), waiting included.
    pub comm_seconds: f64,
    /// The GPU it ran on.
    pub device: usize,
}

/// A decomposed GPU evaluation: the whole system's results, as a
/// single-GPU [`GpuModel::evaluate`] gives them, and one report per rank.
#[derive(Debug, Clone, PartialEq)]
pub struct DecomposedOutput {
    /// Energy, forces, stress and per-atom energies in the system's atom
    /// order; `n_pairs` sums the ranks' local lists (ghost rows included),
    /// `timings` are the slowest rank's, `peak_bytes` is `None`.
    pub output: GpuOutput,
    /// Per rank, in rank order.
    pub ranks: Vec<GpuRankReport>,
}

/// What a rank hands back to be assembled.
#[derive(Debug, Clone, PartialEq)]
struct RankPart {
    owned: Vec<usize>,
    atomic: Vec<f64>,
    forces: Vec<[f64; 3]>,
    /// Energy and virial summed over all ranks (the same bits on every rank).
    totals: [f64; 7],
    report: GpuRankReport,
    timings: GpuTimings,
}

/// The rank's atoms as a cluster: owned atoms at their wrapped positions,
/// then the ghosts at their image positions, no cell.
fn local_system(domain: &RankDomain, system: &System) -> System {
    let numbers = domain
        .local_globals()
        .into_iter()
        .map(|j| system.numbers[j])
        .collect();
    System {
        positions: domain.local_positions(system),
        numbers,
        cell: None,
        pbc: [false; 3],
        ..System::default()
    }
}

fn comm_error(halo: &dyn Distributor, e: impl std::fmt::Display) -> CudaError {
    CudaError::Comm {
        rank: halo.rank(),
        message: e.to_string(),
    }
}

/// One rank's evaluation and the sums over ranks.
fn run_rank(
    gpu: GpuPlacement<'_>,
    domain: &RankDomain,
    system: &System,
    precision: Precision,
    halo: &mut HaloRuntime,
) -> Result<RankPart, CudaError> {
    let start = Instant::now();
    let local = local_system(domain, system);
    let n_owned = domain.n_owned();
    let mut totals = [0.0; 7];
    let (mut atomic, mut forces, mut pairs, mut timings) =
        (Vec::new(), Vec::new(), 0, GpuTimings::default());
    // A rank holding nothing has nothing to exchange either: its peers list
    // no rows for it, so it only joins the sums.
    if !local.positions.is_empty() {
        let dev = gpu.device.fork()?;
        let out = gpu
            .model
            .evaluate_rank(&dev, &local, precision, n_owned, halo)?;
        totals[0] = out.energy;
        totals[1..].copy_from_slice(&out.virial);
        atomic = out.atomic_energies;
        forces = out.forces;
        pairs = out.n_pairs;
        timings = out.timings;
    }
    halo.all_reduce_sum(DataMut::F64(&mut totals))
        .map_err(|e| comm_error(halo, e))?;
    Ok(RankPart {
        owned: domain.owned.clone(),
        atomic,
        forces,
        totals,
        report: GpuRankReport {
            rank: domain.rank,
            owned: n_owned,
            ghosts: domain.ghosts.len(),
            pairs,
            seconds: start.elapsed().as_secs_f64(),
            comm_seconds: halo.comm_seconds(),
            device: gpu.device.index(),
        },
        timings,
    })
}

/// A GPU and the model loaded on it, for the ranks placed there.
#[derive(Clone, Copy)]
pub struct GpuPlacement<'a> {
    /// The device (each rank forks its own stream from it).
    pub device: &'a CudaDevice,
    /// The model with its weights on that device.
    pub model: &'a GpuModel,
}

/// Evaluates `model` on `system` split over `ranks` ranks that share
/// `device` (one thread and one stream each). Every blocking exchange gives
/// up after `timeout`. Errors: [`CudaError::Input`] for a system the
/// partition refuses or no ranks; the first failing rank's own error
/// otherwise (not the peers' reports that it failed).
pub fn evaluate_decomposed(
    model: &GpuModel,
    device: &CudaDevice,
    system: &System,
    precision: Precision,
    ranks: usize,
    timeout: Duration,
) -> Result<DecomposedOutput, CudaError> {
    evaluate_on_gpus(
        &[GpuPlacement { device, model }],
        system,
        precision,
        ranks,
        timeout,
    )
}

/// [`evaluate_decomposed`] over several GPUs: rank `r` runs on
/// `gpus[r % gpus.len()]` (one rank per GPU when there are as many GPUs as
/// ranks). Every placement must hold the same model.
pub fn evaluate_on_gpus(
    gpus: &[GpuPlacement<'_>],
    system: &System,
    precision: Precision,
    ranks: usize,
    timeout: Duration,
) -> Result<DecomposedOutput, CudaError> {
    if ranks == 0 {
        return Err(CudaError::Input("--ranks must be at least 1".into()));
    }
    let Some(first) = gpus.first() else {
        return Err(CudaError::Input("no GPU to place the ranks on".into()));
    };
    if system.positions.is_empty() {
        return Err(CudaError::Input("the system has no atoms".into()));
    }
    let cutoff = first.model.cutoff();
    let partition = partition_system(system, ranks, cutoff).map_err(|e| {
        CudaError::Input(format!("cannot split the system over {ranks} ranks: {e}"))
    })?;
    let plans: Vec<LocalHaloPlan> = halo_plans(&partition).iter().map(Into::into).collect();
    // The weights were uploaded on each device's stream; the ranks' streams
    // read them.
    for gpu in gpus {
        gpu.device.synchronize()?;
    }
    let comms = thread_world(
        ranks,
        ThreadsConfig {
            timeout,
            idle: None,
        },
    )
    .map_err(|e| CudaError::Input(format!("cannot start {ranks} ranks: {e}")))?;
    let outcomes: Vec<Result<RankPart, CudaError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(plans)
            .zip(&partition.ranks)
            .enumerate()
            .map(|(r, ((comm, plan), domain))| {
                let gpu = gpus[r % gpus.len()];
                scope.spawn(move || {
                    let spec = MLIPSpec::standard_energy_model();
                    let mut halo = HaloRuntime::new(Box::new(comm), plan, spec);
                    let out = run_rank(gpu, domain, system, precision, &mut halo);
                    if let Err(e) = &out {
                        // Peers waiting on this rank stop at once.
                        halo.abort(&e.to_string());
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(CudaError::Comm {
                        rank,
                        message: "the rank's thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut parts = Vec::with_capacity(ranks);
    let mut first_comm_error = None;
    for outcome in outcomes {
        match outcome {
            Ok(part) => parts.push(part),
            // A failing rank's peers only report that it failed.
            Err(e @ CudaError::Comm { .. }) => {
                first_comm_error.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = first_comm_error {
        return Err(e);
    }
    assemble(system, parts)
}

/// This process's rank of a decomposed GPU evaluation whose ranks are
/// separate processes (MPI): `comm`'s world is the ranks, every process
/// passes the same `system` (the partition is a pure function of it and
/// the rank count) and its own GPU placement. Rank 0 gets the whole
/// system's results, the other ranks `None`. Errors as
/// [`evaluate_decomposed`]'s; a failing rank aborts the world so that no
/// peer waits.
pub fn evaluate_on_communicator(
    gpu: GpuPlacement<'_>,
    system: &System,
    precision: Precision,
    comm: Box<dyn Communicator>,
) -> Result<Option<DecomposedOutput>, CudaError> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let mut halo = HaloRuntime::new(
        comm,
        LocalHaloPlan::default(),
        MLIPSpec::standard_energy_model(),
    );
    let out = rank_on_communicator(gpu, system, precision, rank, ranks, &mut halo);
    if let Err(e) = &out {
        halo.abort(&e.to_string());
    }
    out
}

fn rank_on_communicator(
    gpu: GpuPlacement<'_>,
    system: &System,
    precision: Precision,
    rank: usize,
    ranks: usize,
    halo: &mut HaloRuntime,
) -> Result<Option<DecomposedOutput>, CudaError> {
    if system.positions.is_empty() {
        return Err(CudaError::Input("the system has no atoms".into()));
    }
    let partition = partition_system(system, ranks, gpu.model.cutoff()).map_err(|e| {
        CudaError::Input(format!("cannot split the system over {ranks} ranks: {e}"))
    })?;
    let plan = halo_plans(&partition)
        .get(rank)
        .map(LocalHaloPlan::from)
        .ok_or_else(|| CudaError::Input(format!("no rank {rank} in the partition")))?;
    let domain = &partition.ranks[rank];
    halo.plan = plan;
    gpu.device.synchronize()?;
    let part = run_rank(gpu, domain, system, precision, halo)?;
    let gathered = halo
        .comm
        .all_gather(SendBuf::F64(&part.to_flat()))
        .map_err(|e| comm_error(halo, e))?;
    if rank != 0 {
        return Ok(None);
    }
    let parts = gathered
        .into_iter()
        .map(|b| match b {
            Buffer::F64(v) => RankPart::from_flat(&v),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| CudaError::Comm {
            rank,
            message: "a rank's results arrived malformed".into(),
        })?;
    assemble(system, parts).map(Some)
}

impl RankPart {
    /// The part as one f64 message: owned count, owned ids, per-atom
    /// energies, forces, the 7 totals, the report and the timings.
    fn to_flat(&self) -> Vec<f64> {
        let n = self.owned.len();
        let mut v = Vec::with_capacity(1 + 5 * n + 7 + 9);
        v.push(n as f64);
        v.extend(self.owned.iter().map(|&g| g as f64));
        v.extend_from_slice(&self.atomic);
        v.extend(self.forces.iter().flatten());
        v.extend_from_slice(&self.totals);
        let r = &self.report;
        v.extend([
            r.rank as f64,
            r.ghosts as f64,
            r.pairs as f64,
            r.seconds,
            r.comm_seconds,
            r.device as f64,
            self.timings.neighbors_s,
            self.timings.model_s,
        ]);
        v
    }

    /// The inverse of [`RankPart::to_flat`]; `None` when malformed.
    fn from_flat(v: &[f64]) -> Option<Self> {
        let n = *v.first()? as usize;
        let rest = v.get(1..)?;
        if rest.len() != 5 * n + 7 + 8 {
            return None;
        }
        let (owned, rest) = rest.split_at(n);
        let (atomic, rest) = rest.split_at(n);
        let (forces, rest) = rest.split_at(3 * n);
        let (totals, r) = rest.split_at(7);
        let mut t = [0.0; 7];
        t.copy_from_slice(totals);
        Some(Self {
            owned: owned.iter().map(|&g| g as usize).collect(),
            atomic: atomic.to_vec(),
            forces: forces.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect(),
            totals: t,
            report: GpuRankReport {
                rank: r[0] as usize,
                owned: n,
                ghosts: r[1] as usize,
                pairs: r[2] as usize,
                seconds: r[3],
                comm_seconds: r[4],
                device: r[5] as usize,
            },
            timings: GpuTimings {
                neighbors_s: r[6],
                model_s: r[7],
            },
        })
    }
}

/// The whole system's results from the ranks' parts.
fn assemble(system: &System, parts: Vec<RankPart>) -> Result<DecomposedOutput, CudaError> {
    let n = system.positions.len();
    let mut forces = vec![[f64::NAN; 3]; n];
    let mut atomic = vec![f64::NAN; n];
    let mut seen = vec![false; n];
    let totals = parts.first().map_or([0.0; 7], |p| p.totals);
    let mut timings = GpuTimings::default();
    let mut ranks = Vec::with_capacity(parts.len());
    let mut n_pairs = 0;
    for part in parts {
        for (k, &g) in part.owned.iter().enumerate() {
            if seen[g] {
                return Err(CudaError::Comm {
                    rank: part.report.rank,
                    message: format!("atom {g} is owned by two ranks"),
                });
            }
            seen[g] = true;
            forces[g] = part.forces[k];
            atomic[g] = part.atomic[k];
        }
        timings.neighbors_s = timings.neighbors_s.max(part.timings.neighbors_s);
        timings.model_s = timings.model_s.max(part.timings.model_s);
        n_pairs += part.report.pairs;
        ranks.push(part.report);
    }
    if let Some(g) = seen.iter().position(|&s| !s) {
        return Err(CudaError::Comm {
            rank: 0,
            message: format!("atom {g} is owned by no rank"),
        });
    }
    let mut virial = [0.0; 6];
    virial.copy_from_slice(&totals[1..]);
    let stress = system
        .cell
        .map(|c| c.volume().abs())
        .filter(|&v| system.pbc.iter().any(|&p| p) && v > 1e-12)
        .map(|v| virial.map(|w| w / v));
    Ok(DecomposedOutput {
        output: GpuOutput {
            energy: totals[0],
            forces,
            stress,
            virial,
            atomic_energies: atomic,
            n_pairs,
            timings,
            peak_bytes: None,
            estimated_bytes: None,
        },
        ranks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_part_survives_its_message_form() {
        let part = RankPart {
            owned: vec![3, 7, 11],
            atomic: vec![-1.5, -2.25, 0.125],
            forces: vec![[0.1, -0.2, 0.3], [1e-300, -0.0, 5.0], [7.0, 8.0, -9.0]],
            totals: [-3.625, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            report: GpuRankReport {
                rank: 2,
                owned: 3,
                ghosts: 40,
                pairs: 1234,
                seconds: 0.5,
                comm_seconds: 0.25,
                device: 1,
            },
            timings: GpuTimings {
                neighbors_s: 0.01,
                model_s: 0.4,
            },
        };
        let flat = part.to_flat();
        assert_eq!(RankPart::from_flat(&flat), Some(part));
        assert_eq!(RankPart::from_flat(&flat[..flat.len() - 1]), None);
        assert_eq!(RankPart::from_flat(&[]), None);
    }
}
