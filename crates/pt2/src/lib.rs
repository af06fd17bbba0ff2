//! Import of `torch.export` archives (`.pt2`) as ddmlip models, with no
//! Python or PyTorch at run time.
//!
//! An archive holds a graph of core-ATen ops (`models/<name>.json`, schema
//! 8.x as torch 2.9–2.11 write it), raw little-endian weight files and
//! ddmlip's metadata (`extra/ddmlip.json`). The graph must follow ddmlip's
//! input contract (`docs/pt2-import.md`):
//! `(positions [N,3], species [N], edge_index [2,E], edge_shift [E,3], cell
//! [3,3]) → (energy [], atomic_energies [N])`, exported with N and E dynamic.
//!
//! - [`Pt2Archive::read`] reads and checks an archive into a typed
//!   [`Program`] with its weights, metadata and size symbols.
//! - [`ImportedModel`] maps the program's ops onto the engine (an engine
//!   [`ddmlip_engine::Model`]): rows of each tensor are Atom or Edge rows by
//!   their size symbol, gathers of atom rows by the edge list are the
//!   engine's gathers (halo reads when decomposed), `index_add` onto atom
//!   rows its scatter, and forces and stress come from the engine's tape.
//! - [`inspect`] summarises an archive: op coverage, inputs, symbols, metadata.

mod archive;
mod error;
mod inspect;
pub mod ir;
mod model;
pub mod ops;
mod rowops;
mod symbols;

pub use archive::{Metadata, Pt2Archive, SizeSymbols, Weight};
pub use error::Pt2Error;
pub use inspect::{inspect, Inspection};
pub use ir::{Node, Program};
pub use model::ImportedModel;
pub use symbols::SizeExpr;

/// The graph schema major version read (torch 2.9–2.11 write 8.x).
pub const SUPPORTED_SCHEMA_MAJOR: u32 = 8;

/// What [`Pt2Error::UnsupportedVersion`] names as supported.
pub const SUPPORTED_VERSIONS: &str =
    "torch.export archives of torch 2.9–2.11 (archive_format pt2, archive_version 0, graph schema 8.x)";
