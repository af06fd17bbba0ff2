//! Atomic systems and batches: positions (Å), atomic numbers, cell, pbc and
//! per-atom / per-system properties, plus the element table and structure
//! file IO: extended XYZ, VASP POSCAR and LAMMPS data files, optionally
//! gzip-compressed.

#![forbid(unsafe_code)]

pub mod build;
mod cell;
pub mod elements;
pub mod extxyz;
pub mod formats;
pub mod lammps;
pub mod poscar;
mod properties;
mod results;
mod system;

pub use cell::to_fractional;
pub use cell::{Cell, CellError, MAX_ABS_LENGTH};
pub use extxyz::{FrameReader, ParseErrorKind, XyzError};
pub use properties::{Column, InfoValue, Properties};
pub use results::{Results, ASE_PER_ATOM_RESULTS, ASE_PER_SYSTEM_RESULTS};
pub use system::{Batch, System, SystemError};

pub use formats::{
    read_structure, stream_structure, write_structure, Format, StructureError, StructureWriter,
};
