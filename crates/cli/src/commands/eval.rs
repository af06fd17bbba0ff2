//! `ddmlip eval`: energies, forces and stress of every frame.

use crate::args::{Backend, EvalArgs};
use crate::error::CliError;
use crate::input::{eval_error, load_model, load_spec, read_structure, write_results};
use crate::output;
use ddmlip::{evaluate, EvalOptions};

/// Runs `eval`; `--backend mpi` runs this process's rank of an MPI job.
pub fn run(a: EvalArgs) -> Result<u8, CliError> {
    if a.backend == Backend::Mpi {
        return super::eval_mpi::run(a);
    }
    let ranks = a.ranks.unwrap_or(1);
    let frames = read_structure(&a.structure)?;
    let model = load_model(&a.model)?;
    let opts = EvalOptions {
        dtype: a.dtype.into(),
        ranks,
        spec: load_spec(&a.spec)?,
        balance: a.balance.into(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let result = evaluate(model.as_ref(), &frames, &opts).map_err(eval_error)?;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(out) = &a.output {
        write_results(out, &frames, &result)?;
    }
    let health = output::report_split_health(&a.structure, a.balance, &frames, &result);
    if a.json {
        println!("{}", output::eval_json(&result, &health));
    } else {
        print!(
            "{}",
            output::eval_text(model.as_ref(), &frames, &result, ranks, seconds)
        );
        if let Some(out) = &a.output {
            println!("wrote {}", out.display());
        }
    }
    Ok(0)
}
