//! `ddmlip eval`: energies, forces and stress of every frame, streamed from
//! the structure file and evaluated one after another on one evaluator.

use super::eval_batch;
use crate::args::{Backend, BalanceArg, EvalArgs};
use crate::error::CliError;
use crate::input::{load_model, load_spec};
use crate::output;
use ddmlip::{DType, EvalOptions};

/// Runs `eval`; `--backend mpi` runs this process's rank of an MPI job.
pub fn run(a: EvalArgs) -> Result<u8, CliError> {
    crate::device::gpus_need_cuda(a.device, a.gpus.as_ref())?;
    let one_process = (a.backend == Backend::Mpi, a.gpus.is_some());
    let engine = crate::device::engine_device(a.device, a.engine_ops, &a.model, one_process)?;
    if let (crate::device::Device::Cuda(index), None) = (a.device, &engine) {
        if a.spec.is_some() {
            return Err(CliError::input(anyhow::anyhow!(
                "--spec does not apply to --device cuda: the GPU models split the same way \
                 every time (ghost node features refreshed after every interaction block); \
                 `ddmlip validate --device cuda` checks that split"
            )));
        }
        if a.backend == Backend::Mpi {
            return gpu_mpi(&a, index);
        }
        return crate::device::eval(&a, index);
    }
    if a.backend == Backend::Mpi {
        return super::eval_mpi::run(a);
    }
    let ranks = a.ranks.unwrap_or(1);
    if let Some(out) = &a.output {
        eval_batch::check_writable(out)?;
    }
    let model = load_model(&a.model, a.modal.as_deref())?;
    let spec = load_spec(&a.spec)?;
    if let (Some(spec), Some(path)) = (&spec, &a.spec) {
        if ranks > 1 {
            eval_batch::warn_unvalidated_spec(
                spec,
                path,
                model.as_ref(),
                &a.model,
                &a.structure,
                ranks,
            );
        }
    }
    let opts = EvalOptions {
        dtype: a.dtype.into(),
        ranks,
        spec,
        balance: a.balance.into(),
        device: engine.as_ref().map(|(d, _)| d.clone()),
        ..Default::default()
    };
    let to_stdout = a.output.as_deref().is_some_and(eval_batch::is_stdio);
    let run = eval_batch::run_batch(
        model.as_ref(),
        opts,
        &a.structure,
        a.output.as_deref(),
        true,
    )?;
    let health = run.health();
    let mut flags = format!("--structure {}", a.structure.display());
    if let BalanceArg::Atoms = a.balance {
        flags.push_str(" --balance atoms");
    }
    if let Some(warning) = output::degenerate_warning(&health, Some(&flags)) {
        eprint!("{warning}");
    }
    if let Some(warning) = eval_batch::absurd_energy_warning(&run) {
        eprint!("{warning}");
    }
    let dtype = DType::from(a.dtype).to_string();
    let report = if a.json {
        let mut obj = eval_batch::batch_json(model.as_ref(), &run, ranks, &dtype);
        if let (Some((_, described)), Some(o)) = (&engine, obj.as_object_mut()) {
            o.insert("device".into(), serde_json::json!(described));
        }
        obj.to_string() + "\n"
    } else {
        let mut text = eval_batch::batch_text(model.as_ref(), &run, ranks);
        if let Some((_, described)) = &engine {
            text.push_str(&format!("device: {described}\n"));
        }
        if let Some(out) = a.output.as_ref().filter(|_| !to_stdout) {
            text.push_str(&format!("wrote {}\n", out.display()));
        }
        text
    };
    // With `--output -` the structure owns stdout; the summary goes to stderr.
    if to_stdout {
        eprint!("{report}");
    } else {
        print!("{report}");
    }
    Ok(0)
}

/// `eval --backend mpi --device cuda`: one GPU per MPI process; needs both
/// the `mpi` and the `cuda` features (exit 2 naming the missing one).
fn gpu_mpi(a: &EvalArgs, index: usize) -> Result<u8, CliError> {
    #[cfg(all(feature = "mpi", feature = "cuda"))]
    {
        crate::device::eval_mpi(a, index)
    }
    #[cfg(not(all(feature = "mpi", feature = "cuda")))]
    {
        let _ = index;
        crate::device::cuda_model(&a.model)?;
        Err(CliError::input(anyhow::anyhow!(
            "`eval --backend mpi --device cuda` needs a ddmlip built with both MPI and CUDA \
             support: `cargo build --release -p ddmlip-cli --features mpi,cuda`"
        )))
    }
}
