//! `ddmlip models`: the built-in models.

use crate::error::CliError;

/// Runs `models`: one line per built-in model.
pub fn run() -> Result<u8, CliError> {
    for (name, desc) in ddmlip::model_names() {
        println!("{name:<20} {desc}");
    }
    Ok(0)
}
