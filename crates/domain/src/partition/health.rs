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

/// The remote-atom rule applied to one axis of the grid.
///
/// A rank holds as ghosts the atoms within `ghost_width` of its domain, so
/// along one axis it sees an interval `w + 2·g` wide (`w = box / k` the
/// domain width, `g` the ghost width), and atoms outside that interval are
/// remote to it. On a periodic axis the interval wraps around a period of
/// `box`, so remote atoms exist when `w + 2g < box`, i.e.
/// `box · (k − 1) / k > 2g`: for two splits `box / 2 > 2g`, for three
/// `box > 3g`, and more splits make it easier (never beyond `box > 2g`). On
/// a non-periodic axis the interval is cut by the atoms' extent; domain `d`
/// (0-based) sees remote atoms when `d·w > g` or `(k − 1 − d)·w > g`, and
/// the middle domain is the last to: every domain does when
/// `⌊k/2⌋ · box / k > g`. These hold for atoms filling the split region.
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
    /// Smallest box width (Å) above which every domain along this axis has
    /// remote atoms with the same number of splits:
    /// `2·ghost_width · k / (k − 1)` when periodic,
    /// `ghost_width · k / ⌊k/2⌋` otherwise.
    pub min_box_for_remote: f64,
    /// `box_width > min_box_for_remote`: every domain along this axis has
    /// atoms beyond its ghosts along this axis alone.
    pub develops_remote: bool,
}

/// The box width above which every one of `splits` domains along an axis
/// has remote atoms (see [`AxisHealth`]); infinite for one split.
pub fn min_box_for_remote(splits: usize, periodic: bool, ghost_width: f64) -> f64 {
    let k = splits as f64;
    if splits < 2 {
        f64::INFINITY
    } else if periodic {
        2.0 * ghost_width * k / (k - 1.0)
    } else {
        ghost_width * k / (splits / 2) as f64
    }
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

    /// What to do about the findings (empty when healthy): a larger system,
    /// and fewer ranks only when some rank owns no atoms.
    pub fn advice(&self) -> &'static str {
        if self.degenerate.is_empty() {
            ""
        } else {
            advice_for(&self.degenerate)
        }
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
            let min_box = min_box_for_remote(splits, partition.periodic[k], partition.ghost_width);
            AxisHealth {
                axis: k,
                periodic: partition.periodic[k],
                splits,
                box_width,
                domain_width,
                two_ghost_width: two_gw,
                min_box_for_remote: min_box,
                develops_remote: box_width > min_box,
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
        "Rule: a rank sees its domain plus ghost_width ({:.3} Å) on each side; along an axis split k ways \
         every domain has remote atoms once box > 2·ghost_width·k/(k−1) (periodic) or \
         box > ghost_width·k/⌊k/2⌋ (non-periodic).",
        partition.ghost_width
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
            "remote atoms appear along this axis".to_string()
        } else {
            format!(
                "too thin: no remote atoms along this axis; needs box > {:.3} Å with {} splits{}",
                a.min_box_for_remote,
                a.splits,
                split_advice(a, partition.ghost_width)
            )
        };
        let _ = writeln!(
            text,
            "axis {} ({kind}): box {:.3} Å / {} = domain {:.3} Å, ghost width {:.3} Å: {verdict}.",
            AXIS_NAMES[a.axis], a.box_width, a.splits, a.domain_width, partition.ghost_width
        );
    }
    if degenerate.is_empty() {
        let _ = writeln!(
            text,
            "Healthy: every rank owns atoms, holds ghosts and has remote atoms."
        );
    } else {
        let advice = advice_for(degenerate);
        let _ = writeln!(
            text,
            "Degenerate: {} finding(s); a validation that passes on this split is weak evidence. {advice}",
            degenerate.len()
        );
    }
    text
}

/// What to do about degenerate findings. More ranks never take remote
/// atoms away along an axis (domains only get narrower), so fewer ranks are
/// advised only when some rank owns nothing.
fn advice_for(degenerate: &[String]) -> &'static str {
    if degenerate.iter().any(|m| m.contains("owns no atoms")) {
        "Use fewer ranks, or a larger system (replicate the cell)."
    } else {
        "Use a larger system (replicate the cell)."
    }
}

/// What else would make remote atoms appear along a too-thin axis with the
/// same box: the fewest splits that do, or that none does.
fn split_advice(a: &AxisHealth, ghost_width: f64) -> String {
    if !(ghost_width > 0.0 && a.box_width.is_finite()) {
        return String::new();
    }
    // Both thresholds fall towards box > 2·ghost_width as splits grow
    // (periodic: for every k; non-periodic: for even k), never below it.
    if a.box_width <= 2.0 * ghost_width {
        return format!(
            "; no number of splits gives remote atoms in a box under 2·ghost_width = {:.3} Å",
            2.0 * ghost_width
        );
    }
    let fewest = (2..=a.splits.max(2) * 64)
        .find(|&k| a.box_width > min_box_for_remote(k, a.periodic, ghost_width));
    match fewest {
        Some(k) if k > a.splits => format!(", or at least {k} splits of this box"),
        Some(k) if a.periodic || k % 2 == 0 => format!(", or {k} splits of this box"),
        Some(_) => ", or an even number of splits of this box".to_string(),
        None => String::new(),
    }
}
