//! `ddmlip demo`: a built-in model on a generated copper crystal, in one
//! process and split over ranks, compared atom by atom, then validated.

use crate::error::{CliError, EXIT_FAILED};
use crate::input::{eval_error, load_model};
use crate::output::{self, fmt_e};
use anyhow::anyhow;
use clap::Args;
use ddmlip::{evaluate, EvalOptions};

#[derive(Args)]
pub struct DemoArgs {
    /// Built-in model to run.
    #[arg(long, default_value = "schnet-demo")]
    pub(crate) model: String,
    /// Ranks for the decomposed run.
    #[arg(long, default_value_t = 4)]
    pub(crate) ranks: usize,
    /// Conventional FCC cells per axis of the generated copper crystal.
    #[arg(long, default_value_t = 6)]
    pub(crate) repeat: usize,
}

/// Runs `demo`.
pub fn run(a: DemoArgs) -> Result<u8, CliError> {
    let model = load_model(&a.model, None)?;
    if a.repeat == 0 {
        return Err(CliError::input(anyhow!("--repeat must be at least 1")));
    }
    let sys = ddmlip::build::demo_copper(a.repeat);
    let frames = vec![sys];
    println!(
        "ddmlip demo: {} on FCC Cu, {} atoms in a {:.2} Å periodic box",
        model.name(),
        frames[0].len(),
        a.repeat as f64 * 3.615
    );
    let t0 = std::time::Instant::now();
    let single = evaluate(model.as_ref(), &frames, &EvalOptions::default()).map_err(eval_error)?;
    let t_single = t0.elapsed().as_secs_f64();
    let opts = EvalOptions {
        ranks: a.ranks,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let split = evaluate(model.as_ref(), &frames, &opts).map_err(eval_error)?;
    let t_split = t0.elapsed().as_secs_f64();
    let health = output::eval_health(&frames, &split);
    if let Some(warning) = output::degenerate_warning(&health, None) {
        eprint!("{warning}");
    }
    print!(
        "{}",
        output::demo_text(&frames[0], &single, &split, a.ranks, t_single, t_split)
    );
    let worst = single.max_relative_difference(&split);
    if worst > 1e-10 {
        println!(
            "FAIL: decomposed run differs from the single-process run (max relative difference {})",
            fmt_e(worst)
        );
        return Ok(EXIT_FAILED);
    }
    println!(
        "OK: the {}-rank run equals the single-process run (max relative difference {}).",
        a.ranks,
        fmt_e(worst)
    );
    // The model author's view: trace, infer a spec, validate it, explain.
    let report = ddmlip::trace_and_validate(
        model.as_ref(),
        &frames,
        &ddmlip::ValidateOptions {
            ranks: a.ranks,
            ..Default::default()
        },
    )
    .map_err(CliError::input)?;
    println!(
        "validate: {} after {} attempt(s) in {:.2} s ({}); `ddmlip validate` prints the full report",
        if report.ok { "PASS" } else { "FAIL" },
        report.attempts.len(),
        report.seconds,
        report.next_action.lines().next().unwrap_or("")
    );
    Ok(if report.ok { 0 } else { EXIT_FAILED })
}
