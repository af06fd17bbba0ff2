//! Rendering results for humans and as JSON.

use crate::args::BalanceArg;
use ddmlip::partition::{Partition, PartitionHealth};
use ddmlip::{EvalResult, Model, System};
use ddmlip_neighbors::NeighborList;
use serde_json::{json, Value};
use std::path::Path;

/// A float in compact scientific notation.
pub fn fmt_e(x: f64) -> String {
    format!("{x:.2e}")
}

// Used by the MPI backend (`--features mpi`) only.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
fn nan_to_null(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

/// The `eval --json` object (docs/design.md §6).
/// `health` is [`eval_health`]'s answer, reported as `partition_health`
/// when the run was split.
// Used by the MPI backend (`--features mpi`) only.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn eval_json(r: &EvalResult, health: &[PartitionHealth]) -> String {
    let mut obj = serde_json::Map::new();
    if !health.is_empty() {
        obj.insert("partition_health".into(), json!(health));
    }
    obj.insert("energy".into(), json!(r.energy().unwrap_or_default()));
    obj.insert("forces".into(), json!(r.forces().unwrap_or_default()));
    let stress: Vec<Value> = r
        .stress()
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.map(|v| json!(v)).unwrap_or(Value::Null))
        .collect();
    obj.insert("stress".into(), Value::Array(stress));
    if let Some(ae) = r.atomic_energies() {
        obj.insert("atomic_energies".into(), json!(ae));
    }
    for (name, o) in &r.outputs {
        if ["energy", "forces", "stress", "atomic_energies"].contains(&name.as_str())
            || name.starts_with('_')
        {
            continue;
        }
        let rows: Vec<Value> = if o.width == 1 {
            o.values.iter().map(|&v| nan_to_null(v)).collect()
        } else {
            o.values
                .chunks(o.width)
                .map(|c| Value::Array(c.iter().map(|&v| nan_to_null(v)).collect()))
                .collect()
        };
        obj.insert(name.clone(), Value::Array(rows));
    }
    serde_json::to_string(&Value::Object(obj)).unwrap_or_default()
}

/// The human summary of an evaluation.
// Used by the MPI backend (`--features mpi`) only.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn eval_text(
    model: &dyn Model,
    frames: &[System],
    r: &EvalResult,
    ranks: usize,
    seconds: f64,
) -> String {
    let mut s = String::new();
    let n_atoms: usize = frames.iter().map(|f| f.len()).sum();
    s.push_str(&format!(
        "model {} | {} frame(s), {} atoms | {} rank(s) | {:.3} s\n",
        model.name(),
        frames.len(),
        n_atoms,
        ranks,
        seconds
    ));
    let forces = r.forces().unwrap_or_default();
    let stress = r.stress().unwrap_or_default();
    let energy = r.energy().unwrap_or_default();
    let mut offset = 0;
    for (i, sys) in frames.iter().enumerate() {
        let f = forces.get(offset..offset + sys.len()).unwrap_or_default();
        let e = energy.get(i).copied().unwrap_or(f64::NAN);
        let fmax = f
            .iter()
            .map(|v| (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt())
            .fold(0.0, f64::max);
        let sum: [f64; 3] = f
            .iter()
            .fold([0.0; 3], |a, v| [a[0] + v[0], a[1] + v[1], a[2] + v[2]]);
        s.push_str(&format!(
            "frame {i}: {} atoms  E = {:.10} eV  ({:.6} eV/atom)  max|F| = {:.6} eV/Å  |ΣF| = {:.1e}\n",
            sys.len(),
            e,
            e / sys.len() as f64,
            fmax,
            (sum[0] * sum[0] + sum[1] * sum[1] + sum[2] * sum[2]).sqrt()
        ));
        if let Some(Some(st)) = stress.get(i) {
            s.push_str(&format!(
                "         stress (eV/Å³, xx yy zz yz xz xy) = [{}]\n",
                st.iter()
                    .map(|v| format!("{v:.6e}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        offset += sys.len();
    }
    if r.diagnostics.bytes_sent > 0 {
        s.push_str(&format!(
            "halo/collective traffic: {} bytes sent\n",
            r.diagnostics.bytes_sent
        ));
    }
    s
}

/// Neighbour statistics of one frame.
pub struct NeighborStats {
    pub n_atoms: usize,
    pub n_pairs: usize,
    pub min_distance: Option<f64>,
    pub max_neighbors: u32,
    pub mean_neighbors: f64,
}

impl NeighborStats {
    pub fn new(sys: &System, nl: &NeighborList) -> Self {
        let counts = nl.counts_per_center(sys.len());
        let min = nl.distances.iter().copied().fold(f64::INFINITY, f64::min);
        Self {
            n_atoms: sys.len(),
            n_pairs: nl.len(),
            min_distance: min.is_finite().then_some(min),
            max_neighbors: counts.iter().copied().max().unwrap_or(0),
            mean_neighbors: if sys.is_empty() {
                0.0
            } else {
                nl.len() as f64 / sys.len() as f64
            },
        }
    }
}

/// `neighbors --json`: totals over frames plus one entry per frame.
pub fn neighbors_json(frames: &[NeighborStats], cutoff: f64, half: bool) -> String {
    let per: Vec<Value> = frames
        .iter()
        .map(|f| {
            json!({"n_atoms": f.n_atoms, "n_pairs": f.n_pairs, "min_distance": f.min_distance,
                   "max_neighbors": f.max_neighbors, "mean_neighbors": f.mean_neighbors})
        })
        .collect();
    serde_json::to_string(&json!({
        "n_atoms": frames.iter().map(|f| f.n_atoms).sum::<usize>(),
        "n_pairs": frames.iter().map(|f| f.n_pairs).sum::<usize>(),
        "cutoff": cutoff,
        "half": half,
        "frames": per,
    }))
    .unwrap_or_default()
}

pub fn neighbors_text(frames: &[NeighborStats], cutoff: f64, half: bool) -> String {
    let mut s = format!(
        "cutoff {cutoff} Å, {} list\n",
        if half { "half" } else { "full (ordered pairs)" }
    );
    for (i, f) in frames.iter().enumerate() {
        s.push_str(&format!(
            "frame {i}: {} atoms, {} pairs, {:.2} neighbours/atom (max {}), closest pair {}\n",
            f.n_atoms,
            f.n_pairs,
            f.mean_neighbors,
            f.max_neighbors,
            f.min_distance
                .map(|d| format!("{d:.4} Å"))
                .unwrap_or_else(|| "none".into())
        ));
    }
    s
}

/// The two most-split axes, for the SVG projection.
pub fn svg_axes(p: &Partition) -> (usize, usize) {
    let mut axes = [0usize, 1, 2];
    axes.sort_by_key(|&a| std::cmp::Reverse(p.grid[a]));
    let (a, b) = (axes[0].min(axes[1]), axes[0].max(axes[1]));
    (a, b)
}

pub fn partition_text(h: &PartitionHealth) -> String {
    let mut s = format!(
        "{} atoms on {} ranks, grid {}×{}×{}, ghost width {:.3} Å\n",
        h.n_atoms, h.n_ranks, h.grid[0], h.grid[1], h.grid[2], h.ghost_width
    );
    s.push_str("rank   owned   ghost  remote\n");
    for r in &h.ranks {
        s.push_str(&format!(
            "{:>4} {:>7} {:>7} {:>7}\n",
            r.rank, r.owned, r.ghost, r.remote
        ));
    }
    if h.degenerate.is_empty() {
        s.push_str("partition is healthy: every rank has owned, ghost and remote atoms\n");
    } else {
        s.push_str("WARNING: degenerate partition\n");
        for d in &h.degenerate {
            s.push_str(&format!("  - {d}\n"));
        }
        s.push_str(&format!("{}\n", h.explanation));
    }
    s
}

/// The health of each frame's split in a decomposed evaluation, in frame
/// order; empty for a single-process run.
pub fn eval_health(frames: &[System], r: &EvalResult) -> Vec<PartitionHealth> {
    r.diagnostics
        .partitions
        .iter()
        .zip(frames)
        .map(|(p, sys)| ddmlip::partition::partition_health(p, sys))
        .collect()
}

/// Frames whose split is named one by one in [`degenerate_warning`]; the
/// rest of a long batch is counted.
const WARNED_FRAMES: usize = 3;

/// A warning for a decomposed evaluation whose split leaves ranks without
/// atoms or lets ranks hold the whole system (the answer is still exact, but
/// the split does not share the work); `None` when every frame's split is
/// healthy or nothing was split.
/// `partition_flags` are the `ddmlip partition` options (besides `--ranks`
/// and `--cutoff`) that reproduce the split, such as `--structure FILE`,
/// when the structure is a file.
pub fn degenerate_warning(
    health: &[PartitionHealth],
    partition_flags: Option<&str>,
) -> Option<String> {
    let degenerate: Vec<(usize, &PartitionHealth)> = health
        .iter()
        .enumerate()
        .filter(|(_, h)| !h.is_healthy())
        .collect();
    let (_, first) = degenerate.first()?;
    let mut s = String::new();
    for (frame, h) in degenerate.iter().take(WARNED_FRAMES) {
        let idle = h.ranks.iter().filter(|r| r.owned == 0).count();
        let whole = h.ranks.iter().filter(|r| r.remote == 0).count();
        let alone = h.ranks.iter().filter(|r| r.ghost == 0).count();
        let n = h.n_ranks;
        let mut findings = Vec::new();
        if idle > 0 {
            findings.push(format!("{idle} of {n} ranks own no atoms and do no work"));
        }
        if whole > 0 {
            findings.push(format!(
                "{whole} of {n} ranks hold every atom, owned or as ghosts, so the split saves them no work"
            ));
        }
        if alone > 0 {
            findings.push(format!("{alone} of {n} ranks have no ghost atoms"));
        }
        s.push_str(&format!(
            "warning: frame {frame}: degenerate split of {} atoms over {} ranks (grid {}x{}x{}, ghost width {:.3} Å): {}.\n",
            h.n_atoms,
            h.n_ranks,
            h.grid[0],
            h.grid[1],
            h.grid[2],
            h.ghost_width,
            findings.join("; ")
        ));
        for line in h.explanation().lines().filter(|l| l.contains("too thin")) {
            s.push_str(&format!("  {line}\n"));
        }
    }
    if degenerate.len() > WARNED_FRAMES {
        s.push_str(&format!(
            "warning: {} more frame(s) split degenerately\n",
            degenerate.len() - WARNED_FRAMES
        ));
    }
    s.push_str(&format!(
        "  The results are exact all the same. {}",
        first.advice().trim_end_matches('.')
    ));
    match partition_flags {
        Some(flags) => s.push_str(&format!(
            "; `ddmlip partition {flags} --ranks {} --cutoff {:.3}` shows the split rank by rank.\n",
            first.n_ranks, first.ghost_width
        )),
        None => s.push_str(".\n"),
    }
    Some(s)
}

pub fn demo_text(
    sys: &System,
    single: &EvalResult,
    split: &EvalResult,
    ranks: usize,
    t1: f64,
    tn: f64,
) -> String {
    let mut s = String::new();
    let first_energy = |r: &EvalResult| {
        r.energy()
            .and_then(|e| e.first().copied())
            .unwrap_or(f64::NAN)
    };
    let (e1, en) = (first_energy(single), first_energy(split));
    s.push_str(&format!("  1 process : E = {e1:.12} eV  ({:.3} s)\n", t1));
    s.push_str(&format!(
        "  {ranks} ranks   : E = {en:.12} eV  ({:.3} s)\n",
        tn
    ));
    let f = single.forces().unwrap_or_default();
    let fmax = f
        .iter()
        .map(|v| (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt())
        .fold(0.0, f64::max);
    s.push_str(&format!(
        "  max |F| = {fmax:.6} eV/Å over {} atoms\n",
        sys.len()
    ));
    if let Some(Some(st)) = single.stress().unwrap_or_default().first() {
        s.push_str(&format!(
            "  pressure = {:.6} GPa\n",
            -(st[0] + st[1] + st[2]) / 3.0 * 160.21766208
        ));
    }
    for (r, (owned, ghost, edges)) in split.diagnostics.rank_sizes.iter().enumerate() {
        s.push_str(&format!(
            "  rank {r}: {owned} owned, {ghost} ghosts, {edges} edges\n"
        ));
    }
    s.push_str(&format!(
        "  halo + collective traffic: {} bytes\n",
        split.diagnostics.bytes_sent
    ));
    s
}

/// The health of each frame's split, after warning on stderr about splits
/// that leave ranks idle or holding the whole system (`structure` and
/// `balance` name the command line that shows the split).
// Used by the MPI backend (`--features mpi`) only.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn report_split_health(
    structure: &Path,
    balance: BalanceArg,
    frames: &[System],
    result: &EvalResult,
) -> Vec<PartitionHealth> {
    let health = eval_health(frames, result);
    let mut flags = format!("--structure {}", structure.display());
    if let BalanceArg::Atoms = balance {
        flags.push_str(" --balance atoms");
    }
    if let Some(warning) = degenerate_warning(&health, Some(&flags)) {
        eprint!("{warning}");
    }
    health
}
