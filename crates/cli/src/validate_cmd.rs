//! `ddmlip validate`: does the model give the single-process answer split
//! over ranks, and if not, which spec fixes it. Thin wrapper over
//! `ddmlip_validate::trace_and_validate`.

use crate::commands::{load_model, read_structure};
use crate::CliError;
use anyhow::{anyhow, Context};
use clap::Args;
use ddmlip_validate::{trace_and_validate, ValidateError, ValidateOptions};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct ValidateArgs {
    /// Built-in model name (see `ddmlip models`) or a model file.
    #[arg(long)]
    model: String,
    /// Extended XYZ structure file (several frames = a batch).
    #[arg(long)]
    structure: PathBuf,
    /// Ranks of the decomposed run (threads).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Prior spec (JSON), kept verbatim as the first candidate; default: the model's own.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Absolute tolerance per output.
    #[arg(long, default_value_t = 1e-8)]
    atol: f64,
    /// Relative tolerance per output (relative to the output's largest |reference| entry).
    #[arg(long, default_value_t = 1e-10)]
    rtol: f64,
    /// Report the first spec's verdict without trying fixes.
    #[arg(long)]
    no_autofix: bool,
    /// Most specs to try, the first included.
    #[arg(long, default_value_t = 8)]
    max_attempts: usize,
    /// Write the working (or best) spec to this file.
    #[arg(long)]
    spec_out: Option<PathBuf>,
    /// Print only the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Deadline (s) of every blocking communication call.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
}

/// Runs the validation; exit status 0 pass, 1 fail (2 comes back as an error).
pub fn validate(a: ValidateArgs) -> Result<u8, CliError> {
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        return Err(CliError::input(anyhow!(
            "--timeout must be a positive number of seconds, got {}",
            a.timeout
        )));
    }
    let prior = a
        .spec
        .as_ref()
        .map(|p| ddmlip_spec::MLIPSpec::load(p).map_err(CliError::input))
        .transpose()?;
    let model = load_model(&a.model)?;
    let frames = read_structure(&a.structure)?;
    let options = ValidateOptions {
        ranks: a.ranks,
        atol: a.atol,
        rtol: a.rtol,
        prior,
        autofix: !a.no_autofix,
        max_attempts: a.max_attempts,
        timeout: Duration::from_secs_f64(a.timeout),
        ..Default::default()
    };
    let report = trace_and_validate(model.as_ref(), &frames, &options).map_err(|e| match e {
        ValidateError::Options(_) | ValidateError::Input(_) => CliError::input(e),
    })?;
    if let Some(out) = &a.spec_out {
        std::fs::write(out, report.spec.to_json() + "\n")
            .with_context(|| format!("writing {}", out.display()))
            .map_err(CliError::input)?;
    }
    if a.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render());
        if let Some(out) = &a.spec_out {
            println!("wrote {}", out.display());
        }
    }
    Ok(if report.ok { 0 } else { crate::EXIT_FAILED })
}
