//! Why an archive cannot be imported.

use std::path::PathBuf;
use thiserror::Error;

/// Errors reading a `.pt2` archive or mapping its graph to the engine.
#[derive(Debug, Error)]
pub enum Pt2Error {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The archive path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not a zip file at all (or truncated before its directory).
    #[error("{path} is not a torch.export archive: {reason}")]
    NotZip {
        /// The archive path.
        path: PathBuf,
        /// What the zip reader found.
        reason: String,
    },
    /// A zip whose structures or payloads are damaged.
    #[error("{path} is corrupted: {source}")]
    Corrupt {
        /// The archive path.
        path: PathBuf,
        /// The zip reader's finding (offset, what).
        #[source]
        source: ddmlip_checkpoint::CheckpointError,
    },
    /// An AOTInductor package: compiled code, no graph to import.
    #[error("{path} is an AOTInductor package (compiled code, no graph); export the model with torch.export.save instead of aoti_compile_and_package")]
    AotInductor {
        /// The archive path.
        path: PathBuf,
    },
    /// A member the format requires is absent.
    #[error("archive has no `{member}`")]
    MissingMember {
        /// The member name, relative to the archive root.
        member: String,
    },
    /// A member is compressed; torch.export stores members uncompressed.
    #[error("archive member `{member}` is compressed; torch.export stores members uncompressed")]
    Compressed {
        /// The member name.
        member: String,
    },
    /// An archive layout or schema this importer does not read.
    #[error("unsupported archive: {found}; supported: {supported}")]
    UnsupportedVersion {
        /// What the archive declares.
        found: String,
        /// The versions this importer reads.
        supported: &'static str,
    },
    /// A JSON member that does not parse or has the wrong structure.
    #[error("`{member}`: {message}")]
    Json {
        /// The member name.
        member: String,
        /// serde's message (with line and column).
        message: String,
    },
    /// A weight tensor that cannot be loaded.
    #[error("weight `{name}`: {message}")]
    Weight {
        /// The parameter or constant name.
        name: String,
        /// What is wrong (dtype, size, non-finite value).
        message: String,
    },
    /// The graph's inputs or outputs do not match ddmlip's input contract.
    #[error("the graph does not match the input contract (positions [N,3] f64, species [N] int64, edge_index [2,E] int64, edge_shift [E,3] f64, cell [3,3] f64) -> (energy [], atomic_energies [N]): {message}")]
    Contract {
        /// What was expected and what was found.
        message: String,
    },
    /// Atom or edge counts fixed at export.
    #[error("the archive has a static {what} count ({size}); re-export with dynamic sizes: torch.export.export(model, args, dynamic_shapes={{'positions': {{0: Dim('atoms')}}, 'species': {{0: Dim('atoms')}}, 'edge_index': {{1: Dim('edges')}}, 'edge_shift': {{0: Dim('edges')}}, 'cell': None}}) (scripts/fixtures/make_pt2_fixtures.py does this)")]
    StaticSizes {
        /// `atom` or `edge`.
        what: &'static str,
        /// The fixed size.
        size: i64,
    },
    /// Ops the engine does not map, every one with its count.
    #[error("the graph uses ops ddmlip does not support: {}", list_ops(.0))]
    UnsupportedOps(Vec<(String, usize)>),
    /// A graph that is inconsistent or uses a supported op in a way the
    /// engine cannot map (naming the node).
    #[error("node `{node}` ({op}): {message}")]
    Node {
        /// The node's output name.
        node: String,
        /// The op.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// `extra/ddmlip.json` is missing a field or has an impossible value.
    #[error("metadata (extra/ddmlip.json): {0}")]
    Metadata(String),
}

fn list_ops(ops: &[(String, usize)]) -> String {
    ops.iter()
        .map(|(op, n)| format!("{op} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
