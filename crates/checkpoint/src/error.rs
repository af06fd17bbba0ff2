//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while locating or reading a checkpoint.
///
/// Malformed input is always reported through one of these variants; the
/// reader never panics on user-supplied bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The SevenNet-0 checkpoint is not in the cache and no override is set.
    #[error(
        "SevenNet-0 checkpoint not found at {searched}. Fetch it with \
         `bash scripts/fetch-sevennet.sh` (downloads the sevenn 0.13.0 wheel from PyPI, \
         verifies the sha256 and stores the file at that path), or set \
         DDMLIP_SEVENNET_CHECKPOINT to the path of an existing checkpoint_sevennet_0.pth"
    )]
    NotFound {
        /// The cache path that was looked at.
        searched: PathBuf,
    },

    /// `DDMLIP_SEVENNET_CHECKPOINT` is set but does not name a readable file.
    #[error(
        "DDMLIP_SEVENNET_CHECKPOINT={path} does not name an existing file. Unset it to use \
         the cache (filled by `bash scripts/fetch-sevennet.sh`), or point it at \
         checkpoint_sevennet_0.pth"
    )]
    EnvPathMissing {
        /// The value of the environment variable.
        path: PathBuf,
    },

    /// Reading the file failed at the operating-system level.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The file is not a PyTorch zip checkpoint (random data, the legacy
    /// non-zip `torch.save` format, a truncated download, or a zip without
    /// `data.pkl`).
    #[error("{path} is not a PyTorch zip checkpoint: {reason}")]
    NotTorchZip {
        /// The file being read.
        path: PathBuf,
        /// Why it was rejected, in words.
        reason: String,
    },

    /// The zip container is structurally broken.
    #[error("corrupt zip archive at byte {offset}: {what}")]
    Zip {
        /// Byte offset in the file where the problem was detected.
        offset: u64,
        /// What was wrong.
        what: String,
    },

    /// The pickle stream is malformed (bad opcode, stack underflow, lengths
    /// running past the input, wrong argument shapes, ...).
    #[error("malformed pickle at byte {offset}: {what}")]
    Malformed {
        /// Byte offset in the pickle stream of the offending opcode.
        offset: usize,
        /// What was wrong.
        what: String,
    },

    /// A tensor's metadata is inconsistent with its storage.
    #[error("invalid tensor on storage `{storage}`: {what}")]
    InvalidTensor {
        /// Storage key (file name under `<root>/data/`).
        storage: String,
        /// What was wrong.
        what: String,
    },

    /// A well-formed construct that this reader deliberately does not handle
    /// (non-float32 storages, compressed entries, exotic opcodes, ...).
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A weight tensor holds a NaN or an infinity.
    #[error(
        "weight tensor `{tensor}` holds a non-finite value ({value} at flat index {index}): \
         the checkpoint is corrupted or comes from a diverged training run"
    )]
    NonFinite {
        /// Name of the tensor in `model_state_dict`.
        tensor: String,
        /// Row-major position of the first non-finite value.
        index: usize,
        /// The value (NaN or ±inf).
        value: f32,
    },

    /// A key expected in a dictionary of the checkpoint is absent.
    #[error("missing key `{0}` in the checkpoint")]
    MissingKey(String),

    /// A value of the checkpoint does not have the expected type.
    #[error("`{key}`: expected {expected}, found {found}")]
    WrongType {
        /// Key (or path) of the value.
        key: String,
        /// What the caller expected.
        expected: &'static str,
        /// What was found (a short type description).
        found: String,
    },
}
