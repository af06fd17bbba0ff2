//! What an evaluation returns: outputs per atom and per system, and where
//! each rank's time went.

use ddmlip_atoms::System;
use ddmlip_domain::Partition;
use ddmlip_engine::Trace;
use ddmlip_spec::OutputKind;
use std::collections::BTreeMap;

/// Internal per-atom output: how many runtime-graph edges each atom centres
/// (the halo-completeness evidence). Names starting with `_` are diagnostics.
pub const NEIGHBOR_COUNTS: &str = "_neighbor_counts";

/// One output of a run: rows are atoms (batch order) or systems.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputData {
    /// Whether rows are atoms, systems or one global row.
    pub kind: OutputKind,
    /// Values per row.
    pub width: usize,
    /// rows × width, row-major.
    pub values: Vec<f64>,
}

/// Results of an evaluation, consolidated over ranks: the physics outputs
/// (energies, forces, stress, per-atom energies and the model's extras) and,
/// apart from them, [`EvalDiagnostics`] about how the run went.
#[derive(Debug, Clone, Default)]
pub struct EvalResult {
    /// Every output by name: `energy`, `forces`, `stress` (periodic systems;
    /// NaN rows otherwise), `atomic_energies`, and model-specific extras.
    /// Names starting with `_` (such as [`NEIGHBOR_COUNTS`]) are internal.
    pub outputs: BTreeMap<String, OutputData>,
    /// Which systems have a stress (periodic, with a cell); one per system.
    pub has_stress: Vec<bool>,
    /// Traces, communication, partitions and timings of the run; no physics.
    pub diagnostics: EvalDiagnostics,
}

/// How an evaluation went: what it traced, sent, partitioned and where the
/// time went. Empty or zero where the run did not record it (a
/// single-process run has no partitions, no bytes sent).
#[derive(Debug, Clone, Default)]
pub struct EvalDiagnostics {
    /// Traces per rank (one entry for a single-process run) when requested.
    pub traces: Vec<Trace>,
    /// Op times of the forward and backward passes per rank, in rank order,
    /// with [`EvalOptions::profile`](crate::EvalOptions::profile) (one entry
    /// for a single-process run; rank 0's only when ranks are processes).
    pub profiles: Vec<ddmlip_engine::OpProfile>,
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
    /// Energy per system (eV), one per system; `None` when the run has no
    /// energy output (an empty batch).
    pub fn energy(&self) -> Option<&[f64]> {
        self.outputs.get("energy").map(|o| o.values.as_slice())
    }

    /// Forces per atom (eV/Å), batch order; `None` when the run has no
    /// forces output.
    pub fn forces(&self) -> Option<Vec<[f64; 3]>> {
        self.outputs
            .get("forces")
            .map(|o| o.values.chunks(3).map(|c| [c[0], c[1], c[2]]).collect())
    }

    /// Stress per system (eV/Å³, Voigt xx yy zz yz xz xy), each `None` for a
    /// non-periodic system; the outer `None` when the run has no stress output.
    pub fn stress(&self) -> Option<Vec<Option<[f64; 6]>>> {
        let o = self.outputs.get("stress")?;
        Some(
            o.values
                .chunks(6)
                .zip(&self.has_stress)
                .map(|(c, &has)| has.then(|| [c[0], c[1], c[2], c[3], c[4], c[5]]))
                .collect(),
        )
    }

    /// Per-atom energies (eV), when the model has them.
    pub fn atomic_energies(&self) -> Option<&[f64]> {
        self.outputs
            .get("atomic_energies")
            .map(|o| o.values.as_slice())
    }

    /// A copy of `batch` (the systems this result was computed for) with
    /// each system's calculator results replaced as ASE reads them back
    /// (`System::set_results`): energy and `free_energy` (equal), forces,
    /// stress (periodic systems) and per-atom `energies` (models that have
    /// them); results the input carried from another calculation are
    /// dropped. Ready to be written as extended XYZ.
    pub fn annotate(&self, batch: &[System]) -> Vec<System> {
        let forces = self.forces().unwrap_or_default();
        let stress = self.stress().unwrap_or_default();
        let energies = self.energy().unwrap_or_default();
        let atomic = self.atomic_energies();
        let mut out = batch.to_vec();
        let mut offset = 0;
        for (s, sys) in out.iter_mut().enumerate() {
            let n = sys.len();
            if let (Some(&energy), Some(f)) = (energies.get(s), forces.get(offset..offset + n)) {
                sys.set_results(&ddmlip_atoms::Results {
                    energy,
                    forces: f,
                    stress: stress.get(s).copied().flatten(),
                    energies: atomic.and_then(|a| a.get(offset..offset + n)),
                });
            }
            offset += n;
        }
        out
    }

    /// The largest relative difference between this run and `other` over
    /// energy (relative to each energy), forces (relative to this run's
    /// largest force component) and stress (relative to each system's
    /// largest component); a NaN force difference counts as infinite. What
    /// `ddmlip demo` reports between its single-process and split runs.
    pub fn max_relative_difference(&self, other: &EvalResult) -> f64 {
        let mut worst: f64 = 0.0;
        for (x, y) in self
            .energy()
            .unwrap_or_default()
            .iter()
            .zip(other.energy().unwrap_or_default())
        {
            worst = worst.max((x - y).abs() / x.abs().max(1e-300));
        }
        let (fa, fb) = (
            self.forces().unwrap_or_default(),
            other.forces().unwrap_or_default(),
        );
        let scale = fa
            .iter()
            .flatten()
            .fold(0.0f64, |m, v| m.max(v.abs()))
            .max(1e-300);
        for (x, y) in fa.iter().flatten().zip(fb.iter().flatten()) {
            let d = (x - y).abs() / scale;
            worst = worst.max(if d.is_nan() { f64::INFINITY } else { d });
        }
        for (sa, sb) in self
            .stress()
            .unwrap_or_default()
            .iter()
            .zip(other.stress().unwrap_or_default())
        {
            if let (Some(sa), Some(sb)) = (sa, sb) {
                let scale = sa.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-300);
                for k in 0..6 {
                    worst = worst.max((sa[k] - sb[k]).abs() / scale);
                }
            }
        }
        worst
    }
}
