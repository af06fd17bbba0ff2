//! Atomic systems and batches: positions (Å), atomic numbers, cell, pbc and
//! per-atom / per-system properties, plus the element table and extended XYZ IO.

mod cell;
mod properties;
mod system;

pub use cell::to_fractional;
pub use cell::{Cell, CellError};
pub use properties::{Column, InfoValue, Properties};
pub use system::{Batch, System, SystemError};
