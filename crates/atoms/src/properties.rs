//! Extra per-system (`info`) and per-atom (`arrays`) data carried through IO.

use std::collections::BTreeMap;

/// A per-system value, as extended XYZ comment lines carry them.
#[derive(Debug, Clone, PartialEq)]
pub enum InfoValue {
    /// Text (quoted in the file when needed).
    Str(String),
    /// A single integer.
    Int(i64),
    /// A single real number.
    Float(f64),
    /// A single logical (`T` / `F`).
    Bool(bool),
    /// Integers; ASE spells several as `"1 2 3"`.
    IntArray(Vec<i64>),
    /// Real numbers in the file's order (`stress` is 9 numbers of a 3×3
    /// matrix in column-major order, or 6 Voigt numbers).
    FloatArray(Vec<f64>),
    /// Logicals.
    BoolArray(Vec<bool>),
}

/// A per-atom column with `width` values per atom, stored row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// Strings (type `S`): values, width.
    Str(Vec<String>, usize),
    /// Integers (type `I`): values, width.
    Int(Vec<i64>, usize),
    /// Real numbers (type `R`): values, width.
    Float(Vec<f64>, usize),
    /// Logicals (type `L`): values, width.
    Bool(Vec<bool>, usize),
}

/// Ordered per-system and per-atom properties.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Properties {
    /// Per-system values by key (comment line `key=value` pairs).
    pub info: BTreeMap<String, InfoValue>,
    /// Per-atom columns by name; each holds `len × width` values.
    pub arrays: BTreeMap<String, Column>,
}
