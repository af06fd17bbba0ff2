//! `ddmlip md --validate`: the decomposed trajectory against the one-rank
//! trajectory, per global atom id, after every step.

use crate::error::CliError;
use anyhow::anyhow;
use ddmlip_atoms::Cell;
use ddmlip_md::{Checkpoint, Frame, MdConfig, MdError, MdSink, StartState, ThermoRow, Topology};
use serde::Serialize;

/// One step's positions and momenta by global id.
type Snapshot = (u64, Vec<[f64; 3]>, Vec<[f64; 3]>);

/// Keeps positions and momenta of every frame (the reference run).
#[derive(Default)]
struct Record {
    frames: Vec<Snapshot>,
}

impl MdSink for Record {
    fn thermo(&mut self, _: &ThermoRow) -> Result<(), MdError> {
        Ok(())
    }
    fn frame(&mut self, f: &Frame, is_final: bool) -> Result<(), MdError> {
        if !is_final {
            self.frames
                .push((f.step, f.positions.clone(), f.momenta.clone()));
        }
        Ok(())
    }
    fn checkpoint(&mut self, _: &Checkpoint) -> Result<(), MdError> {
        Ok(())
    }
}

/// Where the decomposed run stood against the reference.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Departure {
    step: u64,
    atom: usize,
    position_diff: f64,
    momentum_diff: f64,
}

/// Compares each frame of the decomposed run with the reference as it comes.
struct Compare<'a> {
    reference: &'a [Snapshot],
    inverse: Option<[[f64; 3]; 3]>,
    cell: Cell,
    pbc: [bool; 3],
    atol: f64,
    next: usize,
    first: Option<Departure>,
    worst: Departure,
    compared: usize,
}

impl Compare<'_> {
    /// Minimum-image distance along periodic axes (Å).
    fn distance(&self, a: [f64; 3], b: [f64; 3]) -> f64 {
        let mut d = [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
        if let Some(inv) = &self.inverse {
            let mut f = ddmlip_atoms::to_fractional(inv, d);
            for (x, periodic) in f.iter_mut().zip(self.pbc) {
                if periodic {
                    *x -= x.round();
                }
            }
            d = self.cell.to_cartesian(f);
        }
        (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt()
    }
}

impl MdSink for Compare<'_> {
    fn thermo(&mut self, _: &ThermoRow) -> Result<(), MdError> {
        Ok(())
    }
    fn frame(&mut self, f: &Frame, is_final: bool) -> Result<(), MdError> {
        if is_final {
            return Ok(());
        }
        let Some((step, pos, mom)) = self.reference.get(self.next) else {
            return Err(MdError::Internal("more frames than the reference".into()));
        };
        self.next += 1;
        if *step != f.step {
            return Err(MdError::Internal(format!(
                "frame of step {} against step {step}",
                f.step
            )));
        }
        self.compared += 1;
        let mut here = Departure {
            step: *step,
            ..Default::default()
        };
        for (i, (((a, b), p), q)) in f
            .positions
            .iter()
            .zip(pos)
            .zip(&f.momenta)
            .zip(mom)
            .enumerate()
        {
            let dr = self.distance(*a, *b);
            let dp = (0..3).map(|k| (p[k] - q[k]).abs()).fold(0.0, f64::max);
            if dr.max(dp) > here.position_diff.max(here.momentum_diff) {
                here.atom = i;
            }
            here.position_diff = here.position_diff.max(dr);
            here.momentum_diff = here.momentum_diff.max(dp);
        }
        if here.position_diff > self.worst.position_diff
            || here.momentum_diff > self.worst.momentum_diff
        {
            self.worst = Departure {
                position_diff: here.position_diff.max(self.worst.position_diff),
                momentum_diff: here.momentum_diff.max(self.worst.momentum_diff),
                ..here
            };
        }
        if self.first.is_none()
            && (here.position_diff > self.atol || here.momentum_diff > self.atol)
        {
            self.first = Some(here);
        }
        Ok(())
    }
    fn checkpoint(&mut self, _: &Checkpoint) -> Result<(), MdError> {
        Ok(())
    }
}

#[derive(Serialize)]
struct Report {
    ok: bool,
    ensemble: String,
    steps: u64,
    ranks: usize,
    atol: f64,
    frames_compared: usize,
    largest: Departure,
    first_departure: Option<Departure>,
}

/// Runs an MD job on a rank count with a config, into a sink: the engine
/// on thread ranks, or a GPU model's force fields.
pub type RunOn<'a> = dyn FnMut(usize, &MdConfig, &mut dyn MdSink) -> Result<(), MdError> + 'a;

/// Runs the job on 1 rank and on `ranks` through `run`, compares every
/// step; exit 1 when they departed by more than `atol`.
#[allow(clippy::too_many_arguments)]
pub fn validate_trajectory(
    model_name: &str,
    run: &mut RunOn<'_>,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    ranks: usize,
    atol: f64,
    json: bool,
) -> Result<u8, CliError> {
    let mut config = config.clone();
    config.frame_every = 1;
    config.thermo_every = 0;
    config.checkpoint_every = 0;
    config.final_frame = false;
    config.final_checkpoint = false;
    let fail = |e: MdError| match e {
        MdError::Input(_) => CliError::input(e),
        _ => CliError::failed(e),
    };
    let mut reference = Record::default();
    run(1, &config, &mut reference).map_err(fail)?;
    let inverse = (!start.cell.is_zero())
        .then(|| start.cell.inverse().ok())
        .flatten();
    let mut cmp = Compare {
        reference: &reference.frames,
        inverse,
        cell: start.cell,
        pbc: topology.pbc,
        atol,
        next: 0,
        first: None,
        worst: Departure::default(),
        compared: 0,
    };
    run(ranks, &config, &mut cmp).map_err(fail)?;
    if cmp.compared != reference.frames.len() {
        return Err(CliError::failed(anyhow!(
            "the decomposed run produced fewer frames than the reference"
        )));
    }
    let report = Report {
        ok: cmp.first.is_none(),
        ensemble: config.ensemble.name().into(),
        steps: config.steps,
        ranks,
        atol,
        frames_compared: cmp.compared,
        largest: cmp.worst,
        first_departure: cmp.first,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(CliError::failed)?
        );
    } else {
        println!(
            "validate md: {} {} steps of {} on {} ranks against 1 rank, {} frames compared by atom id (atol {:e})",
            report.ensemble, report.steps, model_name, ranks, report.frames_compared, atol
        );
        let w = &report.largest;
        match &report.first_departure {
            None => println!(
                "PASS: largest difference |Δr| = {:.3e} Å, |Δp| = {:.3e} (step {}, atom {})",
                w.position_diff, w.momentum_diff, w.step, w.atom
            ),
            Some(d) => println!(
                "FAIL: first departed at step {}: atom {} |Δr| = {:.3e} Å, |Δp| = {:.3e}; largest at the end of the comparison |Δr| = {:.3e} Å",
                d.step, d.atom, d.position_diff, d.momentum_diff, w.position_diff
            ),
        }
    }
    Ok(if report.ok {
        0
    } else {
        crate::error::EXIT_FAILED
    })
}
