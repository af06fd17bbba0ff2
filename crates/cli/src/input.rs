//! Reading what a command is given (structures, models, specs) and writing
//! results, each failure mapped to its exit status.

use crate::error::CliError;
use anyhow::{anyhow, Context};
use ddmlip::{EvalError, EvalResult, MLIPSpec, Model, System};
use std::path::{Path, PathBuf};

pub fn read_structure(path: &Path) -> Result<Vec<System>, CliError> {
    let frames = ddmlip::read_structure(path).map_err(CliError::input)?;
    if frames.is_empty() {
        return Err(CliError::input(anyhow!("{}: no frames", path.display())));
    }
    Ok(frames)
}

/// A built-in model, model file or checkpoint; `modal` picks the fidelity of
/// a multi-fidelity SevenNet checkpoint.
pub fn load_model(name: &str, modal: Option<&str>) -> Result<Box<dyn Model>, CliError> {
    ddmlip_models::load_model_with_modal(name, modal).map_err(CliError::input)
}

/// Maps an evaluation error to its exit status: bad input 2, a failed run 1.
pub fn eval_error(e: EvalError) -> CliError {
    match e {
        EvalError::Input(_) => CliError::input(e),
        EvalError::Engine(ddmlip::engine::EngineError::Input(_)) => CliError::input(e),
        _ => CliError::failed(e),
    }
}

/// The spec file given with `--spec`, if any.
pub fn load_spec(path: &Option<PathBuf>) -> Result<Option<MLIPSpec>, CliError> {
    path.as_ref()
        .map(|p| {
            MLIPSpec::load(p)
                .with_context(|| format!("spec file {}", p.display()))
                .map_err(CliError::input)
        })
        .transpose()
}

/// Writes `frames` with the energies, forces and stress of `result` to
/// `path` in the format its name implies (extended XYZ carries the results;
/// POSCAR and LAMMPS data only the structure, one frame).
// Used by the MPI backend (`--features mpi`) only.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn write_results(path: &Path, frames: &[System], result: &EvalResult) -> Result<(), CliError> {
    ddmlip::write_structure(path, &result.annotate(frames))
        .with_context(|| format!("writing {}", path.display()))
        .map_err(CliError::input)
}
