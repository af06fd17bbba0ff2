//! Partition health: is every rank doing distributed work, and if not, why.

use super::Partition;
use ddmlip_atoms::System;
use serde::Serialize;
use std::fmt::Write as _;

const AXIS_NAMES: [&str; 3] = ["a", "b", "c"];

/// Atom counts of one rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankHealth {
    /// Rank id.
    pub rank: usize,
    /// Atoms owned by this rank.
    pub owned: usize,
    /// Ghost rows (halo), counting every periodic image separately.
    pub ghost: usize,
    /// Distinct atoms, owned elsewhere, that appear among the ghosts.
    pub distinct_ghost_atoms: usize,
    /// Atoms neither owned nor present as a ghost: total − owned − distinct ghost atoms.
    pub remote: usize,
}

/// The rule of thumb applied to one axis of the grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AxisHealth {
    /// Axis index (0, 1, 2 = a, b, c).
    pub axis: usize,
    /// Whether the axis is periodic.
    pub periodic: bool,
    /// Number of domains along the axis.
    pub splits: usize,
    /// Width (Å) of the split region along the axis normal: the cell height
    /// when periodic, the atoms' bounding box otherwise.
    pub box_width: f64,
    /// `box_width / splits` (Å).
    pub domain_width: f64,
    /// `2 · ghost_width` (Å).
    pub two_ghost_width: f64,
    /// Smallest box width (Å) for which remote atoms appear along this axis
    /// with the same number of splits: `splits · 2 · ghost_width`.
    pub min_box_for_remote: f64,
    /// `domain_width > 2 · ghost_width`.
    pub develops_remote: bool,
}

/// Health summary of a partition (serialisable for `--json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionHealth {
    /// Number of atoms in the system.
    pub n_atoms: usize,
    /// Number of ranks.
    pub n_ranks: usize,
    /// Ranks per axis.
    pub grid: [usize; 3],
    /// Halo width (Å).
    pub ghost_width: f64,
    /// Counts per rank, indexed by rank id.
    pub ranks: Vec<RankHealth>,
    /// The rule of thumb for every axis split more than once.
    pub axes: Vec<AxisHealth>,
    /// One message per degenerate finding; empty when the split is healthy.
    pub degenerate: Vec<String>,
    /// Human-readable explanation of the findings (same as [`PartitionHealth::explanation`]).
    pub explanation: String,
}

impl PartitionHealth {
    /// True when no degenerate finding was made.
    pub fn is_healthy(&self) -> bool {
        self.degenerate.is_empty()
    }

    /// Explanation text: the rule of thumb per split axis, with the domain
    /// width against `2 · ghost_width` and the smallest box that would work.
    pub fn explanation(&self) -> &str {
        &self.explanation
    }
}

/// Counts owned / ghost / remote atoms per rank and flags degenerate ranks:
/// with more than one rank, a rank that owns nothing, holds no ghosts, or
/// has no remote atoms is reported, naming the rank and its counts.
/// `system` must be the system `partition` was built from.
pub fn partition_health(partition: &Partition, system: &System) -> PartitionHealth {
    let n_atoms = system.positions.len();
    let n_ranks = partition.ranks.len();
    let ranks: Vec<RankHealth> = partition
        .ranks
        .iter()
        .map(|d| {
            // Ghosts are sorted by (owner_rank, owner_row), so copies of one
            // atom are adjacent.
            let mut distinct = 0;
            let mut previous = None;
            for g in d.ghosts.iter().filter(|g| g.owner_rank != d.rank) {
                if previous != Some(g.global) {
                    distinct += 1;
                    previous = Some(g.global);
                }
            }
            RankHealth {
                rank: d.rank,
                owned: d.owned.len(),
                ghost: d.ghosts.len(),
                distinct_ghost_atoms: distinct,
                remote: n_atoms.saturating_sub(d.owned.len() + distinct),
            }
        })
        .collect();

    let two_gw = 2.0 * partition.ghost_width;
    let axes: Vec<AxisHealth> = (0..3)
        .filter(|&k| partition.grid[k] > 1)
        .map(|k| {
            let splits = partition.grid[k];
            let box_width = partition.axis_widths[k];
            let domain_width = box_width / splits as f64;
            AxisHealth {
                axis: k,
                periodic: partition.periodic[k],
                splits,
                box_width,
                domain_width,
                two_ghost_width: two_gw,
                min_box_for_remote: two_gw * splits as f64,
                develops_remote: domain_width > two_gw,
            }
        })
        .collect();

    let mut degenerate = Vec::new();
    if n_ranks > 1 {
        for h in &ranks {
            let counts = format!("owned {}, ghost {}, remote {}", h.owned, h.ghost, h.remote);
            if h.owned == 0 {
                degenerate.push(format!(
                    "rank {} owns no atoms ({counts}): it does no work of its own",
                    h.rank
                ));
            }
            if h.ghost == 0 {
                degenerate.push(format!(
                    "rank {} has no ghost atoms ({counts}): the halo exchange is never exercised on it",
                    h.rank
                ));
            }
            if h.remote == 0 {
                degenerate.push(format!(
                    "rank {} has no remote atoms ({counts}): it sees the whole system, so a halo error cannot show up",
                    h.rank
                ));
            }
        }
    }

    let explanation = explain(partition, &axes, &degenerate);
    PartitionHealth {
        n_atoms,
        n_ranks,
        grid: partition.grid,
        ghost_width: partition.ghost_width,
        ranks,
        axes,
        degenerate,
        explanation,
    }
}

fn explain(partition: &Partition, axes: &[AxisHealth], degenerate: &[String]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "grid {}x{}x{} over {} rank(s), ghost width {:.3} Å.",
        partition.grid[0],
        partition.grid[1],
        partition.grid[2],
        partition.ranks.len(),
        partition.ghost_width
    );
    let _ = writeln!(
        text,
        "Rule of thumb: an axis split k ways only develops remote atoms once box_axis / k > 2 · ghost_width ({:.3} Å).",
        2.0 * partition.ghost_width
    );
    if axes.is_empty() {
        let _ = writeln!(text, "No axis is split: a single domain holds every atom.");
    }
    for a in axes {
        let kind = if a.periodic {
            "periodic"
        } else {
            "non-periodic, atoms' extent"
        };
        let verdict = if a.develops_remote {
            "remote atoms can appear along this axis".to_string()
        } else {
            let fewer = match max_splits(a.box_width, a.two_ghost_width) {
                Some(k) => format!("at most {k} split(s) of this box"),
                None => "no split of this axis".to_string(),
            };
            format!(
                "too thin: no remote atoms along this axis; needs box > {:.3} Å with {} splits, or {fewer}",
                a.min_box_for_remote, a.splits
            )
        };
        let _ = writeln!(
            text,
            "axis {} ({kind}): box {:.3} Å / {} = domain {:.3} Å vs 2·ghost_width {:.3} Å: {verdict}.",
            AXIS_NAMES[a.axis], a.box_width, a.splits, a.domain_width, a.two_ghost_width
        );
    }
    if degenerate.is_empty() {
        let _ = writeln!(
            text,
            "Healthy: every rank owns atoms, holds ghosts and has remote atoms."
        );
    } else {
        let _ = writeln!(
            text,
            "Degenerate: {} finding(s); a validation that passes on this split is weak evidence. \
             Use a larger system (replicate the cell) or fewer ranks.",
            degenerate.len()
        );
    }
    text
}

/// Largest `k >= 1` with `box / k > two_gw`, if any.
fn max_splits(box_width: f64, two_gw: f64) -> Option<usize> {
    if !(two_gw > 0.0 && box_width.is_finite()) {
        return None;
    }
    let k = (box_width / two_gw).ceil() - 1.0;
    (k >= 1.0).then_some(k as usize)
}
