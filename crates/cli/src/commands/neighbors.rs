//! `ddmlip neighbors`: neighbour-list statistics of a structure.

use crate::error::CliError;
use crate::input::read_structure;
use crate::output;
use anyhow::anyhow;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct NeighborsArgs {
    /// Extended XYZ structure file.
    #[arg(long)]
    pub(crate) structure: PathBuf,
    /// Cutoff radius (Å).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) cutoff: f64,
    /// Half list: each pair once instead of both directions.
    #[arg(long)]
    pub(crate) half: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Runs `neighbors`.
pub fn run(a: NeighborsArgs) -> Result<u8, CliError> {
    use ddmlip_neighbors::{neighbor_list, NeighborOptions};
    let frames = read_structure(&a.structure)?;
    let mut per_frame = Vec::new();
    for (s, sys) in frames.iter().enumerate() {
        let nl = neighbor_list(
            &sys.positions,
            sys.cell.as_ref(),
            sys.pbc,
            &NeighborOptions {
                cutoff: a.cutoff,
                half: a.half,
            },
        )
        .map_err(|e| CliError::input(anyhow!("frame {s}: {e}")))?;
        per_frame.push(output::NeighborStats::new(sys, &nl));
    }
    if a.json {
        println!("{}", output::neighbors_json(&per_frame, a.cutoff, a.half));
    } else {
        print!("{}", output::neighbors_text(&per_frame, a.cutoff, a.half));
    }
    Ok(0)
}
