//! `ddmlip`: run machine-learned interatomic potentials split over ranks,
//! and prove the split gives the single-process answer.

mod args;
mod commands;
mod device;
mod error;
mod input;
#[cfg(feature = "mpi")]
mod mpi;
mod output;
mod progress;

use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ddmlip",
    version,
    about = "Run machine-learned interatomic potentials by spatial domain decomposition, and prove the split run equals the single-process one",
    long_about = None,
    after_help = "Start with `ddmlip demo`. Structures are extended XYZ files as ASE writes them (several frames = a batch).\nUnits: eV, Å, eV/Å; stress in eV/Å³ (ASE sign, Voigt xx yy zz yz xz xy).\nExit status: 0 success, 1 validation failed / run failed, 2 bad input or usage."
)]
struct Cli {
    #[command(subcommand)]
    command: commands::Command,
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    match commands::run(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", error_message(&e.error));
            ExitCode::from(e.status)
        }
    }
}

/// `ddmlip eval --json | head`: once the reader has gone, a write to stdout
/// fails and `println!` panics. That is not an error of the run: leave with
/// the status a shell gives a process stopped by SIGPIPE (128 + 13) and no
/// backtrace. Every other panic keeps the default report.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

/// The error and its causes joined by ": ", skipping a cause whose text is
/// already in the message: many error types print their source inline and
/// also expose it as `source()`, which would repeat it.
fn error_message(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}
