//! `ddmlip models`: the built-in models, or what a `.pt2` archive holds.

use crate::error::CliError;
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `ddmlip models`.
#[derive(Args)]
pub struct ModelsArgs {
    /// Print what a torch.export archive (.pt2) holds instead: ops with
    /// counts (unsupported ones marked), inputs, size symbols, metadata.
    #[arg(long, value_name = "PATH.pt2")]
    pub inspect: Option<PathBuf>,
}

/// Runs `models`: one line per built-in model, or the inspection of an archive.
pub fn run(args: ModelsArgs) -> Result<u8, CliError> {
    if let Some(path) = args.inspect {
        let inspection = ddmlip_pt2::inspect(&path)
            .with_context(|| format!("cannot inspect {}", path.display()))
            .map_err(CliError::input)?;
        print!("{}", inspection.render());
        return Ok(0);
    }
    for (name, desc) in ddmlip::model_names() {
        println!("{name:<20} {desc}");
    }
    Ok(0)
}
