//! The binary's error type: an error with the exit status it maps to.

/// Exit status for a failed validation (the run worked, the answer is "no").
pub const EXIT_FAILED: u8 = 1;
/// Exit status for bad input or usage.
pub const EXIT_BAD_INPUT: u8 = 2;

/// An error with the exit status it maps to.
#[derive(Debug)]
pub struct CliError {
    /// The process exit status.
    pub status: u8,
    /// What went wrong, with its causes.
    pub error: anyhow::Error,
}

impl CliError {
    /// Bad input or usage: exit status 2.
    pub fn input(error: impl Into<anyhow::Error>) -> Self {
        Self {
            status: EXIT_BAD_INPUT,
            error: error.into(),
        }
    }

    /// The run itself failed: exit status 1.
    pub fn failed(error: impl Into<anyhow::Error>) -> Self {
        Self {
            status: EXIT_FAILED,
            error: error.into(),
        }
    }
}
