//! `bench model --phases`: where a SevenNet step's time goes, per kernel
//! phase (edge features, per interaction the self-connection, linear_1,
//! radial MLP + convolution, linear_2, gate; the readout; each forward and
//! backward), with wall time, CPU time of all threads, FLOPs and rates, and
//! what the runtime spent outside the kernels (neighbour list and inputs,
//! the engine's own ops, among them the edge vectors' backward that
//! assembles forces and virial).
//!
//! The kernels record into `ddmlip_models::sevennet_phases`'s process-wide
//! table; a one-rank evaluation runs nothing else meanwhile, so a phase's
//! CPU time is its threads' alone and `wall × threads − CPU` is the time
//! the pool's threads waited in it (serial sections, imbalance, barriers) —
//! or were descheduled, on a machine shared with other work.

use ddmlip_models::sevennet_phases::{self as recorder, PhaseTotal};
use ddmlip_runtime::RankTimings;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// One kernel phase, per evaluation (mean over the timed evaluations).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelPhase {
    /// Kernel name, as in the engine's trace (`2_convolution`, …).
    pub name: String,
    /// `forward` or `backward`.
    pub pass: String,
    /// Calls per evaluation.
    pub calls: f64,
    /// Wall time per evaluation (s).
    pub wall_s: f64,
    /// CPU time of the process (all threads) per evaluation (s).
    pub cpu_s: f64,
    /// FLOPs per evaluation by `bench/sevennet0_flops.py`'s count (0: not counted).
    pub flops: f64,
}

/// The phase table of one `bench model --phases` child (one rank).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelPhases {
    /// Rayon threads of the rank.
    pub threads: usize,
    /// Atoms of the system.
    pub atoms: usize,
    /// Timed evaluations the means are over.
    pub steps: usize,
    /// The kernel phases, in the order they first ran.
    pub phases: Vec<KernelPhase>,
    /// Mean wall time per evaluation of the runtime's setup (neighbour list
    /// and graph inputs), s.
    pub setup_s: f64,
    /// Mean wall time per evaluation of the forward pass, kernels included, s.
    pub forward_s: f64,
    /// Mean wall time per evaluation of the backward pass, kernels included, s.
    pub backward_s: f64,
    /// Mean wall time per evaluation of collecting the outputs, s.
    pub gather_s: f64,
    /// Mean wall time of a whole evaluation, s.
    pub step_wall_s: f64,
    /// Mean CPU time (all threads) of a whole evaluation, s.
    pub step_cpu_s: f64,
}

/// Collects the runtime's per-evaluation time lines of a phase run.
#[derive(Default)]
pub struct PhaseRun {
    timings: Vec<RankTimings>,
    wall_s: f64,
    cpu_s: f64,
    /// The process CPU clock at [`PhaseRun::begin`] (the kernels' clock).
    cpu_at_begin: Option<f64>,
}

impl PhaseRun {
    /// Starts recording the kernels' phases (anything recorded before, such
    /// as a warm-up, is dropped).
    pub fn start() -> Self {
        recorder::set_enabled(true);
        drop(recorder::take());
        Self::default()
    }

    /// Marks the start of one timed evaluation (reads the CPU clock the
    /// kernels' phases use, so that their sum and the step's agree).
    pub fn begin(&mut self) {
        self.cpu_at_begin = recorder::process_cpu_s();
    }

    /// Adds the evaluation begun at [`PhaseRun::begin`]: its single rank's
    /// time line and its wall time.
    pub fn end(&mut self, timings: Option<&RankTimings>, wall_s: f64) {
        if let Some(t) = timings {
            self.timings.push(*t);
        }
        self.wall_s += wall_s;
        if let (Some(c0), Some(c1)) = (self.cpu_at_begin.take(), recorder::process_cpu_s()) {
            self.cpu_s += c1 - c0;
        }
    }

    /// Stops recording and averages over the `steps` timed evaluations.
    pub fn finish(self, threads: usize, atoms: usize, steps: usize) -> KernelPhases {
        recorder::set_enabled(false);
        let n = steps.max(1) as f64;
        let phases = recorder::take()
            .into_iter()
            .map(|p: PhaseTotal| KernelPhase {
                name: p.name,
                pass: p.pass.name().to_string(),
                calls: p.calls as f64 / n,
                wall_s: p.wall_s / n,
                cpu_s: p.cpu_s / n,
                flops: p.flops / n,
            })
            .collect();
        let k = self.timings.len().max(1) as f64;
        let mean = |f: fn(&RankTimings) -> f64| self.timings.iter().map(f).sum::<f64>() / k;
        KernelPhases {
            threads,
            atoms,
            steps,
            phases,
            setup_s: mean(|t| t.setup),
            forward_s: mean(|t| t.forward),
            backward_s: mean(|t| t.backward),
            gather_s: mean(|t| t.gather),
            step_wall_s: self.wall_s / n,
            step_cpu_s: self.cpu_s / n,
        }
    }
}

/// `2_convolution` → `convolution`: the phase kind, layers merged.
fn kind(name: &str) -> &str {
    match name.split_once('_') {
        Some((layer, rest)) if layer.parse::<usize>().is_ok() => rest,
        _ => name,
    }
}

struct Row<'a> {
    name: &'a str,
    pass: &'a str,
    wall_s: f64,
    cpu_s: f64,
    flops: f64,
}

fn row(o: &mut String, r: &Row<'_>, p: &KernelPhases, total_cpu: f64) {
    let threads = p.threads.max(1) as f64;
    let atoms = p.atoms.max(1) as f64;
    let busy = if r.wall_s > 0.0 {
        r.cpu_s / (r.wall_s * threads)
    } else {
        0.0
    };
    let rate = |s: f64| {
        if r.flops > 0.0 && s > 0.0 {
            format!("{:.1}", r.flops / s * 1e-9)
        } else {
            "—".into()
        }
    };
    let _ = writeln!(
        o,
        "{:<28} {:<8} {:>9.2} {:>9.2} {:>6.0}% {:>9.1} {:>6.1}% {:>9.3} {:>9} {:>9}",
        r.name,
        r.pass,
        r.wall_s * 1e3,
        r.cpu_s * 1e3,
        100.0 * busy,
        r.cpu_s * 1e6 / atoms,
        100.0 * r.cpu_s / total_cpu.max(f64::MIN_POSITIVE),
        r.flops * 1e-9,
        rate(r.cpu_s),
        rate(r.wall_s),
    );
}

/// The text table of `--phases`: every phase, the phases merged over
/// layers, and the time outside the kernels.
pub fn table(p: &KernelPhases) -> String {
    let mut o = String::new();
    if p.phases.is_empty() {
        let _ = writeln!(
            o,
            "--phases: no SevenNet kernel ran (the phase timings cover SevenNet checkpoints)"
        );
        return o;
    }
    let total_cpu = p.step_cpu_s;
    let _ = writeln!(
        o,
        "SevenNet phases per evaluation, mean of {} (1 rank × {} threads, {} atoms); busy = CPU / (wall × threads); core·µs per atom; GFLOP/s per CPU-second and per wall-second",
        p.steps, p.threads, p.atoms
    );
    let header = format!(
        "{:<28} {:<8} {:>9} {:>9} {:>7} {:>9} {:>7} {:>9} {:>9} {:>9}\n",
        "phase",
        "pass",
        "wall ms",
        "cpu ms",
        "busy",
        "core·µs",
        "of cpu",
        "GFLOP",
        "GF/cpu-s",
        "GF/wall-s"
    );
    o.push_str(&header);
    for ph in &p.phases {
        row(
            &mut o,
            &Row {
                name: &ph.name,
                pass: &ph.pass,
                wall_s: ph.wall_s,
                cpu_s: ph.cpu_s,
                flops: ph.flops,
            },
            p,
            total_cpu,
        );
    }
    // Merged over layers, in first-use order.
    let mut kinds: Vec<(String, String, f64, f64, f64)> = Vec::new();
    for ph in &p.phases {
        let k = kind(&ph.name);
        match kinds.iter_mut().find(|e| e.0 == k && e.1 == ph.pass) {
            Some(e) => {
                e.2 += ph.wall_s;
                e.3 += ph.cpu_s;
                e.4 += ph.flops;
            }
            None => kinds.push((
                k.to_string(),
                ph.pass.clone(),
                ph.wall_s,
                ph.cpu_s,
                ph.flops,
            )),
        }
    }
    let _ = writeln!(o, "merged over layers:");
    o.push_str(&header);
    for (name, pass, wall_s, cpu_s, flops) in &kinds {
        row(
            &mut o,
            &Row {
                name,
                pass,
                wall_s: *wall_s,
                cpu_s: *cpu_s,
                flops: *flops,
            },
            p,
            total_cpu,
        );
    }
    let sum = |pass: &str, f: fn(&KernelPhase) -> f64| {
        p.phases
            .iter()
            .filter(|ph| pass.is_empty() || ph.pass == pass)
            .map(f)
            .sum::<f64>()
    };
    let (kw, kc, kf) = (
        sum("", |ph| ph.wall_s),
        sum("", |ph| ph.cpu_s),
        sum("", |ph| ph.flops),
    );
    row(
        &mut o,
        &Row {
            name: "all kernels",
            pass: "both",
            wall_s: kw,
            cpu_s: kc,
            flops: kf,
        },
        p,
        total_cpu,
    );
    row(
        &mut o,
        &Row {
            name: "outside the kernels",
            pass: "both",
            wall_s: p.step_wall_s - kw,
            cpu_s: p.step_cpu_s - kc,
            flops: 0.0,
        },
        p,
        total_cpu,
    );
    let _ = writeln!(
        o,
        "outside the kernels, wall ms: setup (neighbour list, inputs) {:.2}; forward engine ops {:.2}; backward engine ops (edge vectors' backward: forces and virial) {:.2}; outputs {:.2}",
        p.setup_s * 1e3,
        (p.forward_s - sum("forward", |ph| ph.wall_s)) * 1e3,
        (p.backward_s - sum("backward", |ph| ph.wall_s)) * 1e3,
        p.gather_s * 1e3,
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_merge_layers_only() {
        assert_eq!(kind("2_convolution"), "convolution");
        assert_eq!(kind("12_self_interaction_1"), "self_interaction_1");
        assert_eq!(kind("sevennet_edge_features"), "sevennet_edge_features");
        assert_eq!(kind("reduce_input_to_hidden"), "reduce_input_to_hidden");
    }
}
