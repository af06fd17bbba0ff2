//! Error type shared by every kernel of the crate.

/// Errors reported by the kernels and the SevenNet-0 weight loader.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum E3nnError {
    /// A slice does not have the length the kernel needs.
    #[error("wrong length for {what}: expected {expected}, found {found}")]
    Length {
        /// Which argument.
        what: String,
        /// Required number of elements.
        expected: usize,
        /// Number of elements given.
        found: usize,
    },
    /// An index array points outside the rows it indexes.
    #[error("{what}[{position}] = {index} is out of range for {n_rows} rows")]
    Index {
        /// Which index array.
        what: &'static str,
        /// Position inside the index array.
        position: usize,
        /// Offending value.
        index: usize,
        /// Number of rows it indexes.
        n_rows: usize,
    },
    /// An irreps string could not be parsed.
    #[error("cannot parse irreps {input:?}: {reason}")]
    IrrepsParse {
        /// The string given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A request outside what the kernels support (for example l > 3).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Inconsistent configuration (paths, irreps, weights).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The state dict does not match the architecture its config describes.
    #[error("not a SevenNet checkpoint this loader can read (a checkpoint of another architecture?): {0}")]
    Checkpoint(String),
    /// A config key of the checkpoint asks for something not implemented here.
    #[error("config key `{key}` = {value}: {reason}")]
    UnsupportedConfig {
        /// The config key (dotted for nested dicts, e.g. `cutoff_function.cutoff_function_name`).
        key: String,
        /// Its value, as shown to the user.
        value: String,
        /// What is implemented instead.
        reason: String,
    },
    /// A modality (fidelity) of a multi-fidelity model is missing, unknown, or
    /// given to a model without modalities.
    #[error("{}", modal_message(given.as_deref(), valid))]
    Modal {
        /// The name given, if any.
        given: Option<String>,
        /// The model's modality names (empty: not a multi-fidelity model).
        valid: Vec<String>,
    },
    /// The checkpoint file could not be read.
    #[error(transparent)]
    CheckpointRead(#[from] ddmlip_checkpoint::CheckpointError),
    /// An atomic number the model has no species for.
    #[error("unknown element: atomic number {0} is not one of the model's species")]
    UnknownElement(u32),
}

fn modal_message(given: Option<&str>, valid: &[String]) -> String {
    let names = valid.join(", ");
    match given {
        None => {
            format!("this multi-fidelity model needs a modal (--modal NAME); valid modals: {names}")
        }
        Some(m) if valid.is_empty() => {
            format!("modal `{m}` given, but this model has no modals (it is not multi-fidelity)")
        }
        Some(m) => format!("unknown modal `{m}`; valid modals: {names}"),
    }
}

/// Checks that `slice_len == expected`, naming the argument on failure.
pub(crate) fn check_len(what: &str, expected: usize, found: usize) -> Result<(), E3nnError> {
    if expected == found {
        Ok(())
    } else {
        Err(E3nnError::Length {
            what: what.to_string(),
            expected,
            found,
        })
    }
}
