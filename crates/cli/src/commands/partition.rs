//! `ddmlip partition`: how a structure splits over ranks, and whether the
//! split is healthy.

use crate::args::BalanceArg;
use crate::error::CliError;
use crate::input::read_structure;
use crate::output;
use anyhow::{anyhow, Context};
use clap::Args;
use ddmlip::BalancePolicy;
use std::path::PathBuf;

#[derive(Args)]
pub struct PartitionArgs {
    /// Extended XYZ structure file (the first frame is partitioned).
    #[arg(long)]
    pub(crate) structure: PathBuf,
    /// Number of ranks.
    #[arg(long)]
    pub(crate) ranks: usize,
    /// Interaction cutoff (Å); the ghost width is cutoff + skin.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) cutoff: f64,
    /// Extra ghost width (Å).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(crate) skin: f64,
    /// How domain boundaries are placed.
    #[arg(long, value_enum, default_value_t = BalanceArg::Geometric)]
    pub(crate) balance: BalanceArg,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw the split as SVG (ranks coloured, ghosts hollow).
    #[arg(long)]
    pub(crate) svg: Option<PathBuf>,
}

/// Runs `partition`.
pub fn run(a: PartitionArgs) -> Result<u8, CliError> {
    use ddmlip::partition::{partition_health, partition_system_balanced};
    if !(a.cutoff.is_finite() && a.cutoff > 0.0) {
        return Err(CliError::input(anyhow!(
            "--cutoff must be a positive number of Å, got {}",
            a.cutoff
        )));
    }
    if a.ranks == 0 {
        return Err(CliError::input(anyhow!("--ranks must be at least 1")));
    }
    let frames = read_structure(&a.structure)?;
    let sys = &frames[0];
    sys.validate().map_err(CliError::input)?;
    let balance = BalancePolicy::from(a.balance).partition_balance();
    let p = partition_system_balanced(sys, a.ranks, a.cutoff + a.skin, balance)
        .map_err(CliError::input)?;
    let health = partition_health(&p, sys);
    if let Some(svg) = &a.svg {
        let axes = output::svg_axes(&p);
        std::fs::write(svg, ddmlip::partition::render_svg(&p, sys, axes))
            .with_context(|| format!("writing {}", svg.display()))
            .map_err(CliError::input)?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&health).unwrap_or_default()
        );
    } else {
        print!("{}", output::partition_text(&health));
        if let Some(svg) = &a.svg {
            println!("wrote {}", svg.display());
        }
    }
    Ok(0)
}
