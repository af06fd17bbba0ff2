//! Atomic systems and batches: positions (Å), atomic numbers, cell, pbc and
//! per-atom / per-system properties, plus the element table and extended XYZ IO.

#![forbid(unsafe_code)]

pub mod build;
mod cell;
pub mod elements;
pub mod extxyz;
mod properties;
mod system;

pub use cell::to_fractional;
pub use cell::{Cell, CellError};
pub use extxyz::{FrameReader, ParseErrorKind, XyzError};
pub use properties::{Column, InfoValue, Properties};
pub use system::{Batch, System, SystemError};

/// Reads every structure (frame) of a structure file as a batch. Every file
/// is read as extended XYZ (plain XYZ included), whatever its extension.
pub fn read_structure(path: impl AsRef<std::path::Path>) -> Result<Vec<System>, XyzError> {
    extxyz::read_file(path)
}
